"""A trained NextN head written as a head-only GGUF: the layout a DRAFT layer holding an MTP head has.

llama.cpp stores an MTP head as block N = n_layer (``blk.N.*`` for its attention and FFN, ``blk.N.nextn.*`` for
eh_proj and the two input norms) with ``block_count`` counting it and ``nextn_predict_layers`` 1. A head-only file
has no token embedding (what marks it as a head, ``engine.contract.capabilities.is_mtp_head_only``) but carries its
target's metadata, vocabulary included, so that create checks it against the target as it checks any drafter.
Where the head came from is recorded under ``tandem.drafter.*`` (what ``/api/show`` reports).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import gguf
import numpy as np
from torch import Tensor

from engine.contract.drafter_provenance import PROVENANCE_PREFIX

_SKIPPED = ("GGUF.", "general.file_type", "general.name")


def write_head_gguf(path: str | os.PathLike, target_path: str | os.PathLike, tensors: Mapping[str, Tensor],
                    provenance: Mapping[str, Any], name: str) -> Path:
    """Write ``tensors`` (float32, GGUF names) as a head-only GGUF for the target at ``target_path``, atomically
    (a temporary file renamed into place)."""
    path = Path(path)
    reader = gguf.GGUFReader(str(target_path))
    arch = str(reader.fields["general.architecture"].contents())
    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    block_count_key = f"{arch}.block_count"
    for key, field in reader.fields.items():
        if key.startswith(_SKIPPED) or key == "general.architecture" or key == block_count_key or \
                key == f"{arch}.nextn_predict_layers" or key.startswith(PROVENANCE_PREFIX):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), value_type, sub_type)
    n_layer = int(reader.fields[block_count_key].contents())
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(n_layer + 1)
    writer.add_nextn_predict_layers(1)
    for key, value in provenance.items():
        writer.add_key_value(PROVENANCE_PREFIX + key, value, _value_type(value))
    for tensor_name in sorted(tensors):
        writer.add_tensor(tensor_name, np.ascontiguousarray(tensors[tensor_name].detach().float().numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def _value_type(value: Any) -> gguf.GGUFValueType:
    if isinstance(value, bool):
        return gguf.GGUFValueType.BOOL
    if isinstance(value, int):
        return gguf.GGUFValueType.UINT64
    if isinstance(value, float):
        return gguf.GGUFValueType.FLOAT32
    return gguf.GGUFValueType.STRING
