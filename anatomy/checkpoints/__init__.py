"""Real checkpoints: open any model by name, path, GGUF file or Hub id; save it back.

    model = anatomy.from_pretrained("minilm")             # built-in names: anatomy.BUILTIN_MODELS
    model = anatomy.from_pretrained("org/name")           # a Hub id, through the Hugging Face cache
    tokenizer = anatomy.load_tokenizer("path/to/dir")     # anatomy's one Tokenizer type
    anatomy.save_pretrained(model, "out/")                # transformers can load it back

    resolver.py   names, paths, GGUF files and Hub ids (hub.py) -> a loaded model and its tokenizer
    registry.py   the architectures, one file of data each (bert.py, gpt2.py, llama.py, ...)
    hf.py         Hugging Face folders <-> models, through an architecture's table and the engine
    rope.py       the rotary settings in transformers 4's and 5's spellings (both written, either read)
    config_keys.py  which config.json keys are read; an UnknownConfigKeysWarning names the others
    engine.py     applies any table in both directions, checking every tensor by name
    memory.py     builds on the meta device and refuses what the machine cannot hold, before allocating
    files.py      safetensors (memory-mapped), pytorch_model.bin (weights_only), shard indexes
    writing.py    writes a folder whole: safetensors shards, and a staging folder moved into place
    native.py     anatomy's own format, for configs no Hugging Face architecture expresses
    tokenizer.py  the Tokenizer type;  sentence.py  sentence-transformers embeddings;  toys.py  the toys

Every problem is a CheckpointError naming the file or the id, raised before a model is returned.
"""

from __future__ import annotations

from ..lazy import lazy_names

__all__ = lazy_names(__name__, {
    "ARCHITECTURES": ".registry", "supported_architectures": ".registry",
    "BUILTIN_MODELS": ".names",
    "CheckpointError": ".files",
    "UnknownConfigKeysWarning": ".config_keys",
    "architecture_of": ".hf", "read_config": ".hf",
    "from_pretrained": ".resolver", "load_tokenizer": ".resolver",
    "save_pretrained": ".save",
    "sentence_embeddings": ".sentence",
    "Tokenizer": ".tokenizer",
})
