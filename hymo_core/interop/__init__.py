"""Leaving HyMo: a checkpoint as a Hugging Face transformers directory (hf_export, with hf_layout's
config and weight-name maps, hf_tokenizer's tokenizer files and the hybrid's shipped modeling code in
remote_code/), and lm-evaluation-harness over HyMo's models and benchmark files (lm_eval_adapter,
lm_eval_tasks, harness).

May import: `hymo_core.models`, `hymo_core.checkpoint`, `hymo_core.eval`, `hymo_core.train` (the corpus
reader), `manifests` (benchmark files). transformers and lm-eval are imported only where they are used
(the `interop` extra); the export itself needs neither.
"""
