"""tx.interop: Hugging Face checkpoints in and out (docs below are filled in later)."""

from tx.interop.export import export_hf
from tx.interop.load import load_hf, read_hf_config
