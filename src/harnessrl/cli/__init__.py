"""Command-line entry points. Modules here parse arguments and config and import heavy packages
(torch, transformers) lazily inside commands, so ``harnessrl --help`` starts fast."""
