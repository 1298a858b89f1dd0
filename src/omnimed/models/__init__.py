"""Loading causal LMs and encoders from a config: PyPI-packaged real models, hub ids, local paths, tiny test models."""
