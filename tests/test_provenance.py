"""The provenance record: what convert writes (ascendv1.ProvenanceRecord) is what verify and inspect
read back (ascendv1.Provenance), field by field, and the file's bytes keep their key order."""

from __future__ import annotations

import dataclasses
import json

from ascendconv.ascendv1 import Provenance, ProvenanceRecord, SourceFileRecord, SourceRecord, provenance_document
from ascendconv.package_files import dump_json

RECORD = ProvenanceRecord(
    tool="ascendconv",
    version="9.8.7",
    source=SourceRecord(
        name="Kimi-K2",
        format="hf-fp8-block",
        quantization_config="text_config.quantization_config",
        params={"weight_block_size": [128, 64]},
        files=(SourceFileRecord("a.safetensors", 1234, "ab" * 32), SourceFileRecord("b.safetensors", 0, "cd" * 32)),
    ),
    scheme="w4a8-mxfp-moe",
    scale_rule="floor",
    resolve_dtype="fp16",
    kernel="reference",
    fallbacks=({"module": "model.layers.0.mlp", "requested": "W4A8_MXFP", "written": "FLOAT", "reason": "K=100"},),
    source_nonfinite={"model.embed_tokens.weight": 3},
    checksum="blake3",
)
DIGESTS = {"quant_model_weights-00002-of-00002.safetensors": "22" * 32, "quant_model_weights-00001-of-00002.safetensors": "11" * 32}


def read_back(tmp_path, document: dict) -> Provenance:
    dump_json(tmp_path / "provenance.json", document)
    return Provenance(json.loads((tmp_path / "provenance.json").read_text(encoding="utf-8")))


def test_every_written_field_reads_back(tmp_path):
    base = RECORD.base()
    read = read_back(tmp_path, RECORD.document(DIGESTS))
    for field in dataclasses.fields(ProvenanceRecord):
        assert getattr(read, field.name) == base[field.name], field.name
    assert read.source == {
        "name": "Kimi-K2",
        "format": "hf-fp8-block",
        "quantization_config": "text_config.quantization_config",
        "params": {"weight_block_size": [128, 64]},
        "files": [
            {"name": "a.safetensors", "size": 1234, "fingerprint": "ab" * 32},
            {"name": "b.safetensors", "size": 0, "fingerprint": "cd" * 32},
        ],
    }
    assert read.source_name == "Kimi-K2" and read.source_files == base["source"]["files"]
    assert read.source_format == "hf-fp8-block"
    assert read.source_nonfinite == {"model.embed_tokens.weight": 3}
    assert {name: read.digest(name) for name in DIGESTS} == DIGESTS
    assert read.digest("quant_model_weights-00003-of-00002.safetensors") is None


def test_the_file_keeps_its_key_order_and_layout(tmp_path):
    """Golden bytes: the fields in declaration order, shards last and sorted, indent 2."""
    one_file = dataclasses.replace(
        RECORD, source=dataclasses.replace(RECORD.source, files=RECORD.source.files[:1]), fallbacks=(), source_nonfinite={}
    )
    dump_json(tmp_path / "p.json", one_file.document({"s2": "22", "s1": "11"}))
    assert (tmp_path / "p.json").read_text(encoding="utf-8") == (
        '{\n  "tool": "ascendconv",\n  "version": "9.8.7",\n  "source": {\n    "name": "Kimi-K2",\n'
        '    "format": "hf-fp8-block",\n    "quantization_config": "text_config.quantization_config",\n'
        '    "params": {\n      "weight_block_size": [\n        128,\n        64\n      ]\n    },\n    "files": [\n      {\n        "name": "a.safetensors",\n        "size": 1234,\n'
        f'        "fingerprint": "{"ab" * 32}"\n      }}\n    ]\n  }},\n  "scheme": "w4a8-mxfp-moe",\n'
        '  "scale_rule": "floor",\n  "resolve_dtype": "fp16",\n  "kernel": "reference",\n  "fallbacks": [],\n'
        '  "source_nonfinite": {},\n  "checksum": "blake3",\n  "added_tensors": {},\n  "shards": {\n    "s1": {\n      "blake3": "11"\n'
        '    },\n    "s2": {\n      "blake3": "22"\n    }\n  }\n}\n'
    )


def test_a_part_manifests_copy_gives_the_same_document():
    """assemble writes the provenance from the record's JSON kept in a part manifest: same document."""
    kept = json.loads(json.dumps(RECORD.base()))
    assert provenance_document(kept, DIGESTS) == RECORD.document(DIGESTS)
    assert list(RECORD.document(DIGESTS)) == [f.name for f in dataclasses.fields(ProvenanceRecord)] + ["shards"]


def test_a_package_written_before_source_formats_reads_as_block_fp8():
    """0.3's provenance records no format (it read only HF block FP8) and a top-level weight_block_size."""
    old = {"tool": "ascendconv", "source": {"name": "m", "quantization_config": "quantization_config",
                                            "weight_block_size": [128, 128], "files": []}}
    assert Provenance(old).source_format == "hf-fp8-block"
    assert Provenance({**old, "source": {**old["source"], "format": ["x"]}}).source_format is None
