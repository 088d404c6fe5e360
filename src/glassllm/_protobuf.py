"""The protobuf wire reader under its older name: :mod:`glassllm.tokenizers.protobuf`."""

from .tokenizers.protobuf import fields

__all__ = ["fields"]
