"""Opening a Llama you already have, under its older module name: :mod:`glassllm.interop.importer`."""

from .interop.importer import build_model, import_model, load_source, source_kind

__all__ = ["load_source", "import_model", "source_kind", "build_model"]
