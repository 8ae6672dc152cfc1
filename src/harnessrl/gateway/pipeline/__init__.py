"""The life of a model call, the same for every provider API.

``driver`` runs a call from its HTTP request to its answer (``serve``: prepare, gate, generate,
record, answer whole or, through ``streaming``, as server-sent events); ``answer`` is what each API
renders for it; ``calls`` is the prepared call and its record; ``limits`` the checks a request must
pass and the sampling settings; ``generation`` drives the engine and applies stop strings;
``delivery`` and ``coalesce`` take the answer to its client (drops, backpressure, slow readers);
``wire`` writes JSON and SSE.
"""
