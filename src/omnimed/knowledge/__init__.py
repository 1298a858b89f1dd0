"""The multi-source knowledge base: chunking, sparse / dense / graph indexes, fusion, reranking, one facade."""
