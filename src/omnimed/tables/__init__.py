"""Paper tables: manifests (``experiments/<paper>/<table>.yaml``), running them (reproduce), writing them beside the
published numbers (report: md / csv / png), and comparing runs (compare)."""
