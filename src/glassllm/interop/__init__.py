"""Interop: open the Llamas others made, and hand glassllm's models to their tools.

=============  ==========================================================
``hf``         Hugging Face Llama folders: the config, the weights under
               Hugging Face's names (wq/wk rows reordered for RoPE), export
               and import (the ``tokenizer.json`` itself is a tokenizer file
               format: :mod:`glassllm.tokenizers.hfjson`)
``gguf``       reading a ``.gguf`` file (F32, F16, BF16, Q8_0)
``llama2c``    reading a llama2.c ``.bin`` and its ``tokenizer.bin``
``importer``   any of the three as a glassllm model file
               (``glassllm import SOURCE OUT``)
=============  ==========================================================

The modules are imported on use: ``import glassllm.interop`` reads none of them.
"""
