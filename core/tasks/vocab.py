"""Byte-level vocabulary shared by the zoo's text and induction models.

Tokens 0..255 are raw bytes; four specials sit above them so no byte can be mistaken for one.
"""

N_BYTES = 256
BOS = 256  # beginning of sequence (first token of every text window)
PAD = 257  # padding, never trained on
EOS = 258  # end of sequence
SEP = 259  # separator between segments
BYTE_VOCAB_SIZE = 260

SPECIAL_TOKENS = {"BOS": BOS, "PAD": PAD, "EOS": EOS, "SEP": SEP}
TOKEN_LABELS = {BOS: "<bos>", PAD: "<pad>", EOS: "<eos>", SEP: "<sep>"}


def token_label(token: int) -> str:
    """A byte token as a short readable label: printable characters, \\xNN, or <bos>/<pad>/<eos>/<sep>."""
    token = int(token)
    if token in TOKEN_LABELS:
        return TOKEN_LABELS[token]
    if 33 <= token < 127:
        return chr(token)
    if token == 32:
        return "␣"
    return f"\\x{token:02x}" if 0 <= token < N_BYTES else str(token)

