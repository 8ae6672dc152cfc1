"""Supervised fine-tuning on recorded rollouts (``harnessrl sft``, docs/sft.md).

``select`` chooses the rollouts (reward, flags, audit), ``conversations`` reads each call as an OpenAI
chat conversation and its answer (also the JSONL export), ``render`` renders them with the student's
chat template into token sequences with loss on the answer tokens only, ``data`` loads a store's
selection and orders it into steps, ``step`` is one optimizer step of cross-entropy, ``run`` the whole
run with checkpoints, resume and metrics. Only ``step`` and ``run`` (when it trains) import torch.
"""
