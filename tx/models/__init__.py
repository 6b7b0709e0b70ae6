"""tx.models: the three families built only from tx.layers blocks."""

from tx.models.build import build_model, count_params, dummy_inputs, init_params
from tx.models.families import DecoderOnly, EncoderDecoder, EncoderOnly
