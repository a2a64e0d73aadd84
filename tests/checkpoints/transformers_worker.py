"""Run by a python with some version of transformers (4.x in its own virtual environment, or the suite's
5.x): load each folder a job names, as a user of that version would, and write what it computes.

    python transformers_worker.py JOBS.json

JOBS.json: a list of {"name", "folder", "class", "inputs", "out", "resave"}. "inputs" is a safetensors
file of named input sets, "unpadded.input_ids", "padded.attention_mask", ... (a set's tensors are the
keyword arguments of the model's forward); "out" gets one tensor per set, the logits (or, for a model
without a head, the last hidden state). "resave", when given, is a folder the loaded model is saved to
with this version's own save_pretrained. The report (stdout, JSON) gives the version, and per folder
what transformers logged or warned while loading it, and the config values it reads (or, where it
could not load or run the folder, the error).
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
import warnings

import torch
import transformers
from safetensors.torch import load_file, save_file

# What each version makes of the fields that decide the computation (None where a config has no such field).
READ_BACK = ("rope_theta", "rope_scaling", "rope_parameters", "rope_local_base_freq", "partial_rotary_factor",
             "rotary_pct", "sliding_window", "layer_types", "use_sliding_window", "head_dim", "tie_word_embeddings",
             "scale_decoder_outputs", "torch_dtype", "dtype", "query_pre_attn_scalar", "attn_logit_softcapping",
             "final_logit_softcapping")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _plain(value):
    """A config value as JSON (a dtype as its name)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def run(job: dict) -> dict:
    collect = _Collect()
    logger = logging.getLogger("transformers")
    logger.addHandler(collect)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = getattr(transformers, job["class"]).from_pretrained(job["folder"], attn_implementation="eager")
    finally:
        logger.removeHandler(collect)
    model.eval()
    inputs = load_file(job["inputs"])
    outputs = {}
    for name in sorted({key.split(".")[0] for key in inputs}):
        kwargs = {key.split(".", 1)[1]: value for key, value in inputs.items() if key.split(".")[0] == name}
        with torch.no_grad():
            out = model(**kwargs)
        logits = getattr(out, "logits", None)
        outputs[name] = (logits if logits is not None else out.last_hidden_state).contiguous()
    save_file(outputs, job["out"])
    if job.get("resave"):
        model.save_pretrained(job["resave"])
    config = model.config
    return {"messages": collect.messages + [str(w.message) for w in caught],
            "config": {name: _plain(getattr(config, name, None)) for name in READ_BACK},
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}


def run_or_say_why(job: dict) -> dict:
    """run(job), or {"error": the exception's last lines} when this version cannot load or run the folder."""
    try:
        return run(job)
    except Exception:  # noqa: BLE001 - reported per folder: the test of that folder fails with it
        return {"error": traceback.format_exc()[-2000:]}


def main(jobs_path: str) -> None:
    transformers.logging.set_verbosity_warning()
    with open(jobs_path) as handle:
        jobs = json.load(handle)
    report = {"version": transformers.__version__, "folders": {job["name"]: run_or_say_why(job) for job in jobs}}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
