"""Special token ids, fixed and shared by every tx tokenizer.

    id  name  piece    meaning
    0   PAD   <pad>    padding; masks are derived as `tokens != PAD_ID`
    1   BOS   <s>      beginning of sequence (callers add it; `encode` never does)
    2   EOS   </s>     end of sequence (callers add it; `encode` never does)
    3   UNK   <unk>    a character outside the vocabulary (char tokenizer only in
                       practice: byte and sentencepiece with byte fallback never emit it)
    4   MASK  <mask>   MLM mask; never produced by encoding text, even text that
                       literally contains "<mask>"

Ordinary tokens start at `NUM_SPECIALS`. `decode` drops PAD, BOS, EOS and MASK and
renders UNK (and any id outside the vocabulary) as U+FFFD.
"""

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
MASK_ID = 4
NUM_SPECIALS = 5

# Piece strings, indexed by id; sentencepiece models are trained to match them.
SPECIAL_PIECES = ('<pad>', '<s>', '</s>', '<unk>', '<mask>')

# Ids `decode` leaves out of the text.
SKIPPED_IDS = (PAD_ID, BOS_ID, EOS_ID, MASK_ID)

# What UNK and out-of-vocabulary ids decode to.
REPLACEMENT = '\ufffd'
