"""Supervised fine-tuning on recorded rollouts (``harnessrl sft``, docs/sft.md).

``select`` chooses the rollouts (reward, flags, audit), ``conversations`` reads each call as an OpenAI
chat conversation and its answer (also the JSONL export), ``render`` renders them with the student's
chat template into token sequences with loss on the answer tokens only, ``step`` is one optimizer
step of cross-entropy, ``run`` the whole run with checkpoints and resume. Only ``step`` and ``run``
import torch.
"""
