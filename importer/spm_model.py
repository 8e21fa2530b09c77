"""The few fields of a SentencePiece ``tokenizer.model`` a GGUF needs, read without protobuf.

A tokenizer.model is a serialized ``sentencepiece.ModelProto``. Only three things matter here: the
pieces (text, score, type), ``normalizer_spec.add_dummy_prefix`` (prepend a space) and
``trainer_spec.model_type``. Reading them takes a 40-line wire-format walker instead of the
``sentencepiece``/``protobuf`` packages. Piece types use the numbering GGUF's token types copied
(NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from .request import CreateError

_BPE = 2  # trainer_spec.model_type: UNIGRAM 1, BPE 2, WORD 3, CHAR 4


@dataclass(frozen=True)
class SpmModel:
    pieces: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    add_dummy_prefix: bool
    model_type: int


class _Truncated(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise _Truncated("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs: an int for varints, bytes for everything else."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, value
            continue
        if wire == 2:
            size, pos = _varint(buf, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise _Truncated(f"unsupported wire type {wire}")
        if pos + size > len(buf):
            raise _Truncated("truncated field")
        yield field, buf[pos:pos + size]
        pos += size


def read_spm_model(data: bytes, role: str) -> SpmModel:
    pieces: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    add_dummy_prefix, model_type = True, 1
    try:
        for field, value in _fields(data):
            if field == 1 and isinstance(value, bytes):  # repeated SentencePiece
                piece, score, kind = "", 0.0, 1
                for f, v in _fields(value):
                    if f == 1 and isinstance(v, bytes):
                        piece = v.decode("utf-8")
                    elif f == 2 and isinstance(v, bytes):
                        score = struct.unpack("<f", v)[0]
                    elif f == 3 and isinstance(v, int):
                        kind = v
                pieces.append(piece)
                scores.append(score)
                types.append(kind)
            elif field == 2 and isinstance(value, bytes):  # trainer_spec
                model_type = next((v for f, v in _fields(value) if f == 3 and isinstance(v, int)), model_type)
            elif field == 3 and isinstance(value, bytes):  # normalizer_spec
                add_dummy_prefix = bool(next((v for f, v in _fields(value) if f == 3 and isinstance(v, int)),
                                             add_dummy_prefix))
    except (_Truncated, UnicodeDecodeError, struct.error) as e:
        raise CreateError(f"{role}: tokenizer.model is not a valid SentencePiece model ({e})") from None
    if not pieces:
        raise CreateError(f"{role}: tokenizer.model holds no pieces")
    if model_type != _BPE:
        raise CreateError(f"{role}: tokenizer.model is a SentencePiece model of type {model_type}; tandem imports "
                          "BPE models only (or a tokenizer.json)")
    return SpmModel(tuple(pieces), tuple(scores), tuple(types), add_dummy_prefix, model_type)
