"""`hymo train`, `hymo eval` and `hymo generate`: the trainer's command line (no Prefect server needed)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich.console import Console

console = Console()


def cmd_train(args: argparse.Namespace) -> int:
    from hymo_core.train.run import train_from_args
    from manifests.staleness import refuse_stale_corpus

    if args.corpus:
        refuse_stale_corpus(args.corpus, "training")  # one line naming the stale stage and the rerun that refreshes it

    if args.nproc:
        from hymo_core.distributed.launch import LaunchError

        from hymo_core.exit_codes import CRASHED, REFUSED, STOPPED

        try:
            summary = launch_from_args(args)
        except (LaunchError, ValueError) as exc:  # the first error of any rank (or of the batch plan), one line
            if getattr(exc, "stopped", False):  # rank 0's stop line, naming the summary: 3, as in one process
                print(exc, file=sys.stderr)
                return STOPPED
            print(f"error: {exc}", file=sys.stderr)
            return CRASHED if isinstance(exc, LaunchError) and not exc.refused else REFUSED  # a rank's traceback is a crash
    else:
        summary = train_from_args(args)  # errors: one line from flows.cli.main
    console.print(f"step {summary['final_step']}: train loss {summary['final_train_loss']:.4f}, "
                  f"validation loss {summary['final_val_loss']}, weights sha256 {summary['weights_sha256'][:16]}…")
    pictures = "loss.png, expert_load.png" if summary.get("final_expert_load") else "loss.png"
    console.print(f"wrote {args.out}/summary.json, metrics.jsonl, {pictures}, checkpoints/")
    return 0


def launch_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`--nproc N`: the batch plan checked here, then the run under torchrun, rank 0's lines streamed; its summary.

    Raises LaunchError naming the first rank that failed (each rank's output: OUT/logs/rank-N.log).
    """
    from pathlib import Path

    from hymo_core.distributed.launch import check_batch_plan, launch_training, train_arguments
    from hymo_core.train.config import SUMMARY_FILE
    from hymo_core.train.run import _configs, resume_of_args

    check_batch_plan(_configs(args)[0], args.nproc)
    train_args = train_arguments(args.corpus, args.out, args.config, args.max_steps, args.horizon, resume_of_args(args),
                                 args.strict_resume)
    train_args += [f"--set={override}" for override in getattr(args, "set", [])]  # each rank reads the same recipe
    launch_training(args.nproc, train_args + (["--cloze", args.cloze] if args.cloze else []), on_line=lambda line: print(line, flush=True),
                    max_restarts=args.max_restarts, threads=args.threads)
    return json.loads((Path(args.out) / SUMMARY_FILE).read_text(encoding="utf-8"))


def evaluate_checkpoint(checkpoint: str, corpus: str, batches: int | None = None, cloze: str | None = None) -> dict[str, Any]:
    """Held-out loss / perplexity on the windows training evaluated (per source and language too), and cloze accuracy."""
    from hymo_core.checkpoint.load import load_model
    from hymo_core.checkpoint.tokenizer_identity import check_corpus_tokenizer
    from hymo_core.eval.evaluation import SAMPLE_CLOZE, load_cloze, load_tokenizer, score_cloze
    from hymo_core.eval.heldout import HeldOutSet, evaluate_heldout
    from hymo_core.train.data import CorpusReader
    from hymo_core.train.run import default_device

    device = default_device()
    model, payload = load_model(checkpoint, device)
    reader = CorpusReader(corpus)
    check_corpus_tokenizer(payload, checkpoint, reader)
    if reader.vocab_size != model.config.vocab_size:
        raise ValueError(f"{checkpoint}: vocab_size {model.config.vocab_size}, but {reader.path} has {reader.vocab_size}")
    train_config = payload["train_config"]
    held = (HeldOutSet.from_corpus(reader, train_config["seq_len"], train_config["batch_size"], max_batches=batches) if batches
            else HeldOutSet.corpus_default(reader, train_config["seq_len"], train_config["batch_size"]))  # not the run's eval_batches
    heldout = evaluate_heldout(model, held, device)
    val_loss = heldout.loss
    result: dict[str, Any] = {"checkpoint": checkpoint, "step": payload["state"]["step"], "val_loss": val_loss,
                              "val_perplexity": math.exp(min(val_loss, 50)), "ln_vocab": math.log(reader.vocab_size),
                              "val_bpb": heldout.groups["all"]["bpb"], "groups": heldout.to_record()["groups"],
                              "validation_tokens": heldout.groups["all"]["tokens"], "windows": len(held), "selection": held.selection,
                              "same_corpus": payload["manifest_digest"] == reader.digest}
    scores = score_cloze(model, load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"]), load_cloze(cloze or SAMPLE_CLOZE), device)
    result["cloze"] = {k: v for k, v in scores.items() if k != "per_item"}
    return result


def cmd_eval_suite(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hymo_core.eval.report import EVAL_MD, default_out, run_suite
    from hymo_core.eval.sandbox import SandboxUnavailable
    from hymo_core.train.run import default_device

    out = Path(args.out) if args.out else default_out(args.checkpoint)
    try:
        result = run_suite(args.checkpoint, args.suite, args.corpus, args.limit, out, default_device(), args.mmlu_format,
                           log=lambda line: console.print(line, markup=False), unsafe_exec=args.unsafe_exec,
                           num_fewshot=args.num_fewshot, fewshot_seed=args.fewshot_seed, threads=args.threads,
                           **({"generation_batch_size": args.generation_batch_size} if args.generation_batch_size else {}))
    except SandboxUnavailable as exc:
        raise SystemExit(f"hymo eval: {exc}") from None
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "tasks"} | {"tasks": {t: {k: v for k, v in r.items() if k != "per_item"}
                                                                                     for t, r in result["tasks"].items()}}, indent=2))
        return 0
    print((out / EVAL_MD).read_text(encoding="utf-8"))
    console.print(f"wrote {out}/eval.json and {EVAL_MD}", markup=False)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    checkpoints = args.checkpoint
    if args.harness or args.suite:
        if len(checkpoints) > 1:
            raise SystemExit("hymo eval: --suite and --harness take one checkpoint")
        args.checkpoint = checkpoints[0]
    if args.harness:
        from flows.cli.interop import cmd_eval_harness

        return cmd_eval_harness(args)
    if args.suite:
        return cmd_eval_suite(args)
    if not args.corpus:
        raise SystemExit("hymo eval: --corpus is required without --suite")
    if len(checkpoints) > 1:
        return cmd_eval_paired(args)
    result = evaluate_checkpoint(checkpoints[0], args.corpus, args.batches, args.cloze)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cloze = result["cloze"]
    console.print(f"{result['checkpoint']} (step {result['step']})", markup=False)
    console.print(f"  validation loss {result['val_loss']:.4f} nats/token (ln V = {result['ln_vocab']:.2f}), "
                  f"perplexity {result['val_perplexity']:.1f}, over {result['validation_tokens']:,} tokens "
                  f"({result['windows']} windows: {result['selection']})"
                  + ("" if result["same_corpus"] else "  [not the corpus it was trained on]"))
    for name, group in sorted(result["groups"].items()):
        bpb = "" if group["bpb"] is None else f", {group['bpb']:.4f} bits/byte"
        console.print(f"    {name}: {group['loss']:.4f} nats/token{bpb} over {group['tokens']:,} tokens", markup=False)
    console.print(f"  cloze accuracy {cloze['accuracy']:.3f} ± {cloze['accuracy_stderr']:.3f} (summed log-prob), "
                  f"{cloze['accuracy_length_normalised']:.3f} ± {cloze['accuracy_length_normalised_stderr']:.3f} (length-normalised); "
                  f"chance {cloze['chance']:.3f}, {cloze['items']} items")
    return 0


def cmd_eval_paired(args: argparse.Namespace) -> int:
    """Several checkpoints: the same held-out windows and cloze items, each paired against the first."""
    from hymo_core.eval.paired import compare_checkpoints, comparison_lines
    from hymo_core.train.run import default_device

    result = compare_checkpoints(args.checkpoint, args.corpus, args.batches, args.cloze, default_device())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for line in comparison_lines(result):
        console.print(line, markup=False)
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from hymo_core.checkpoint.average import average_checkpoints

    result = average_checkpoints(args.checkpoints, args.out, args.mode, args.decay)
    weights = ", ".join(f"{w:.3f}" for w in result["weights"])
    console.print(f"wrote {result['out']}: {result['mode']} average of {len(result['checkpoints'])} checkpoints (weights {weights}), "
                  f"{result['parameters']:,} values; judge it with `hymo eval {' '.join(args.checkpoints[-1:])} {result['out']} --corpus ...`",
                  markup=False)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """A training directory (metrics.jsonl) gets the training page; a run directory with document stages, the data page."""
    from pathlib import Path

    from hymo_core.train.run_report import write_report

    if not (Path(args.run) / "metrics.jsonl").exists():
        from flows.data_report import is_data_run

        if Path(args.run).is_dir() and is_data_run(Path(args.run)):
            from flows.data_report_page import write_data_report

            path = write_data_report(args.run, args.out)
            console.print(f"wrote {path}: funnel, rules with their thresholds and what-ifs, clusters, search (open it in a browser)", markup=False)
            return 0
    path = write_report(args.run, args.out)
    console.print(f"wrote {path}", markup=False)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from hymo_core.checkpoint.load import load_model
    from hymo_core.checkpoint.tokenizer_identity import check_corpus_tokenizer
    from hymo_core.train.data import CorpusReader
    from hymo_core.eval.evaluation import generate, load_tokenizer
    from hymo_core.train.run import default_device

    device = default_device()
    model, payload = load_model(args.checkpoint, device)
    reader = CorpusReader(args.corpus)
    check_corpus_tokenizer(payload, args.checkpoint, reader)  # another tokenizer of the same size decodes garbage
    if reader.vocab_size != model.config.vocab_size:
        raise ValueError(f"{args.checkpoint}: vocab_size {model.config.vocab_size}, but {reader.path} has {reader.vocab_size}")
    tokenizer = load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"])
    text = generate(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed, device, reader.eos_id)
    print(args.prompt + text)
    return 0


def export_safetensors(checkpoint: str, target: str) -> dict[str, Any]:
    """One consolidated file of every weight (tied ones under both names), whatever world size wrote the checkpoint."""
    from pathlib import Path

    from safetensors.torch import save_file

    from hymo_core.checkpoint.load import load_model

    model, payload = load_model(checkpoint)
    tensors = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    metadata = {"format": "pt", "model_config": json.dumps(payload["model_config"]), "step": str(payload["state"]["step"])}
    temporary = Path(target).with_name(Path(target).name + ".tmp")
    save_file(tensors, temporary, metadata=metadata)
    temporary.replace(target)
    return {"tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values()), "path": target}


def cmd_export(args: argparse.Namespace) -> int:
    if args.hf:
        from flows.cli.interop import cmd_export_hf

        return cmd_export_hf(args)
    result = export_safetensors(args.checkpoint, args.safetensors)
    console.print(f"wrote {result['path']}: {result['tensors']} tensors, {result['parameters']:,} values", markup=False)
    return 0


def add_commands(sub: Any) -> None:
    from hymo_core.train.arguments import add_train_arguments

    train = sub.add_parser("train", help="pretrain on a corpus: checkpoints, metrics.jsonl, loss.png, summary.json")
    add_train_arguments(train)
    train.add_argument("--nproc", type=int, help="ranks on this machine: run under torchrun with FSDP2 (gloo on CPU, nccl on CUDA)")
    train.add_argument("--max-restarts", type=int, default=0,
                       help="with --nproc: torchrun restarts the group this often after a rank dies; it resumes from the "
                            "newest complete checkpoint")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser("eval", help="validation loss, perplexity and cloze accuracy of a checkpoint; --suite: the benchmark suite")
    evaluate.add_argument("checkpoint", nargs="+", help="a checkpoint (with --harness also a `hymo export --hf` directory); "
                          "several: a paired comparison on the same held-out windows and cloze items")
    evaluate.add_argument("--corpus", help="run directory, shards stage directory or corpus.json (with --suite: default, the run above the checkpoint)")
    evaluate.add_argument("--suite", help="benchmark suite: default (HellaSwag, ARC-E/C, MMLU, GSM8K, HumanEval + held-out perplexity) or mc")
    evaluate.add_argument("--limit", type=int, help="with --suite: the first N items of each task (of each MMLU subject)")
    evaluate.add_argument("--out", help="with --suite: where eval.json and eval.md go (default: RUN/eval/NN_pretrain-CKPT_NAME for a stage checkpoint, else CKPT_DIR/../eval/CKPT_NAME)")
    evaluate.add_argument("--mmlu-format", choices=["rc", "letters"], default="rc", help="MMLU as cloze (OLMES rc) or lettered choices (lm-eval mmlu)")
    evaluate.add_argument("--num-fewshot", type=int, default=0, metavar="K",
                          help="with --suite: K examples before each prompt, from a split never scored (MMLU dev, OLMES's curated train shots)")
    evaluate.add_argument("--fewshot-seed", type=int, default=1234, help="which K of the bundled shots (default 1234, lm-eval's)")
    evaluate.add_argument("--unsafe-exec", action="store_true",
                          help="with --suite: run HumanEval's generated code even where the namespace sandbox fails (eval.json records sandbox: unsafe)")
    evaluate.add_argument("--generation-batch-size", type=int, metavar="N",
                          help="with --suite: GSM8K / HumanEval prompts decoded together (default 64; each generation is "
                               "token for token the one-at-a-time one, so no number depends on it)")
    evaluate.add_argument("--threads", type=int, metavar="N", help="with --suite: intra-op threads (default: $HYMO_THREADS, else "
                          "$OMP_NUM_THREADS, else the CPUs this process may use); recorded in eval.json")
    evaluate.add_argument("--batches", type=int, help="validation batches of the checkpoint's batch size (default: the corpus's "
                          "fixed held-out set, up to 262,144 tokens, the same for every checkpoint of one window length)")
    evaluate.add_argument("--cloze", help="cloze JSONL (default: the bundled sample set)")
    evaluate.add_argument("--harness", choices=["lm-eval"], help="run lm-evaluation-harness itself, offline, on the bundled benchmark files")
    evaluate.add_argument("--tasks", help="with --harness: comma-separated, of hellaswag, arc_easy, arc_challenge, mmlu, gsm8k "
                                          "(default: hellaswag,arc_easy,arc_challenge)")
    evaluate.add_argument("--json", action="store_true", help="print JSON instead of text")
    evaluate.set_defaults(func=cmd_eval)

    average = sub.add_parser("average", help="uniform or EMA average of checkpoints with one parameter layout, as one checkpoint file")
    average.add_argument("checkpoints", nargs="+", help="oldest first (EMA weighs the later ones more)")
    average.add_argument("--out", required=True, help="the averaged checkpoint file to write")
    average.add_argument("--mode", choices=["uniform", "ema"], default="uniform", help="equal weights, or exponential (later ones more)")
    average.add_argument("--decay", type=float, default=0.9, help="EMA: checkpoint i of n weighs decay^(n-1-i)")
    average.set_defaults(func=cmd_average)

    report = sub.add_parser("report", help="one HTML page of a run: for a data run, funnel, rule distributions with what-ifs, clusters and "
                                           "search; for a training run, curves per source and language, forecast, signals, alerts")
    report.add_argument("run", help="a run directory (RUN, from hymo run) or a training output directory (metrics.jsonl, summary.json), "
                                    "e.g. RUN/NN_pretrain or --out of hymo train")
    report.add_argument("--out", help="where to write the page (default: RUN/report.html)")
    report.set_defaults(func=cmd_report)

    gen = sub.add_parser("generate", help="sample a continuation from a checkpoint")
    gen.add_argument("checkpoint", help="checkpoint file or DCP directory")
    gen.add_argument("--corpus", required=True, help="the corpus whose tokenizer the model was trained with")
    gen.add_argument("--prompt", required=True, help="text to continue")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="tokens to sample (default 64)")
    gen.add_argument("--temperature", type=float, default=0.8, help="softmax temperature (default 0.8)")
    gen.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens (default 50)")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    gen.set_defaults(func=cmd_generate)

    export = sub.add_parser("export", help="a checkpoint (single file or DCP directory) as one safetensors file, or as a Hugging Face model directory")
    export.add_argument("checkpoint", help="checkpoint file or DCP directory")
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument("--safetensors", metavar="FILE", help="where to write the consolidated weights")
    target.add_argument("--hf", metavar="DIR", help="a transformers directory: Llama / Qwen3 for the dense model, HymoForCausalLM "
                                                    "(shipped modeling code, trust_remote_code) for the hybrid; tokenizer included")
    export.add_argument("--corpus", help="with --hf: the corpus whose tokenizer the model was trained with (default: the run above the checkpoint)")
    export.set_defaults(func=cmd_export)
