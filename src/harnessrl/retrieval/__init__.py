"""A local retriever served to sandboxed harnesses through the gateway (docs/retrieval.md).

``config`` (``[retrieval]``), ``corpus`` (reading and fingerprinting a corpus), ``index`` (the
tantivy BM25 index, cached per corpus content), ``route`` (the gateway routes and the per-rollout
rate limit), ``harness_tools`` (the ``search`` command and the MCP server a harness runs inside its
sandbox, and where they live). The gateway never imports this package: the app's composer does.
"""
