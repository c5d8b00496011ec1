"""The provenance record: what convert writes (ascendv1.ProvenanceRecord) is what verify and inspect
read back (ascendv1.Provenance), field by field, and the file's bytes keep their key order."""

from __future__ import annotations

import dataclasses
import json

from ascendconv.ascendv1 import (
    HubRecord,
    Provenance,
    ProvenanceRecord,
    SourceFileRecord,
    SourceRecord,
    package_date,
    provenance_document,
)
from ascendconv.package_files import dump_json

RECORD = ProvenanceRecord(
    tool="ascendconv",
    version="9.8.7",
    source=SourceRecord(
        name="Kimi-K2",
        format="hf-fp8-block",
        quantization_config="text_config.quantization_config",
        params={"weight_block_size": [128, 64]},
        files=(
            SourceFileRecord("a.safetensors", 1234, "ab" * 32, "ef" * 32),
            SourceFileRecord("b.safetensors", 0, "cd" * 32, "01" * 32),
        ),
    ),
    scheme="w4a8-mxfp-moe",
    scale_rule="floor",
    resolve_dtype="fp16",
    kernel="reference",
    fallbacks=({"module": "model.layers.0.mlp", "requested": "W4A8_MXFP", "written": "FLOAT", "reason": "K=100"},),
    source_nonfinite={"model.embed_tokens.weight": 3},
    checksum="blake3",
    hub=HubRecord("moonshotai/Kimi-K2", "0123abcd" * 5),
    deployment={"tp": 8, "ep": True, "shared_experts_as_routed": False, "mtp_heads": False},
    overrides=("model.layers.1.*=FLOAT",),
    command="ascendconv convert moonshotai/Kimi-K2@0123abcd OUT --scheme w4a8-mxfp-moe",
)
DATE = "2026-12-01T21:30:00Z"
DIGESTS = {"quant_model_weights-00002-of-00002.safetensors": "22" * 32, "quant_model_weights-00001-of-00002.safetensors": "11" * 32}
SIZES = {"quant_model_weights-00002-of-00002.safetensors": 4096, "quant_model_weights-00001-of-00002.safetensors": 8192}
READS = {"quant_model_weights-00002-of-00002.safetensors": "44" * 32, "quant_model_weights-00001-of-00002.safetensors": "33" * 32}
FILES = {"tokenizer.json": "33" * 32, "config.json": "44" * 32}


def read_back(tmp_path, document: dict) -> Provenance:
    dump_json(tmp_path / "provenance.json", document)
    return Provenance(json.loads((tmp_path / "provenance.json").read_text(encoding="utf-8")))


def test_every_written_field_reads_back(tmp_path):
    base = RECORD.base()
    read = read_back(tmp_path, RECORD.document(DIGESTS, SIZES, FILES, DATE, READS))
    for field in dataclasses.fields(ProvenanceRecord):
        assert getattr(read, field.name) == base[field.name], field.name
    assert read.source == {
        "name": "Kimi-K2",
        "format": "hf-fp8-block",
        "quantization_config": "text_config.quantization_config",
        "params": {"weight_block_size": [128, 64]},
        "files": [
            {"name": "a.safetensors", "size": 1234, "fingerprint": "ab" * 32, "tensor_sample": "ef" * 32},
            {"name": "b.safetensors", "size": 0, "fingerprint": "cd" * 32, "tensor_sample": "01" * 32},
        ],
    }
    assert read.source_name == "Kimi-K2" and read.source_files == base["source"]["files"]
    assert read.source_format == "hf-fp8-block"
    assert read.source_nonfinite == {"model.embed_tokens.weight": 3}
    assert {name: read.digest(name) for name in DIGESTS} == DIGESTS
    assert read.digest("quant_model_weights-00003-of-00002.safetensors") is None
    assert read.hub == {"repo_id": "moonshotai/Kimi-K2", "revision": "0123abcd" * 5} and read.date == DATE
    assert read.deployment == {"tp": 8, "ep": True, "shared_experts_as_routed": False, "mtp_heads": False}
    assert read.details()["overrides"] == ["model.layers.1.*=FLOAT"]
    assert {name: read.size(name) for name in SIZES} == SIZES and read.files == FILES
    assert read.field_problems() == []  # every field of the shape convert writes


def test_fields_of_the_wrong_type_read_as_absent():
    read = Provenance({"hub": {"repo_id": 3}, "deployment": {"tp": True, "ep": False, "shared_experts_as_routed": False},
                       "overrides": "x", "command": ["ascendconv"], "date": 1})
    assert (read.hub, read.deployment, read.overrides, read.command, read.date) == (None, None, [], None, None)
    assert Provenance({"deployment": {"tp": 0, "ep": False, "shared_experts_as_routed": False}}).deployment is None


def test_a_deployment_recorded_before_mtp_heads_reads_without_it_and_one_of_the_wrong_type_is_named():
    older = Provenance({"deployment": {"tp": 2, "ep": False, "shared_experts_as_routed": False}})
    assert older.deployment == {"tp": 2, "ep": False, "shared_experts_as_routed": False}
    assert older.deployment_problems() == []
    odd = Provenance({"deployment": {"tp": 2, "ep": False, "shared_experts_as_routed": False, "mtp_heads": "no"}})
    assert odd.deployment == {"tp": 2, "ep": False, "shared_experts_as_routed": False}
    assert odd.deployment_problems() == ["deployment.mtp_heads is a string ('no'), expected true or false"]


def test_the_date_is_source_date_epoch_when_set_else_now():
    assert package_date({"SOURCE_DATE_EPOCH": "0"}) == "1970-01-01T00:00:00Z"
    assert package_date({"SOURCE_DATE_EPOCH": "1764624600"}) == "2025-12-01T21:30:00Z"
    import time

    before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(time.time())))
    assert before <= package_date({}) <= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1))


def test_the_file_keeps_its_key_order_and_layout(tmp_path):
    """Golden bytes: the fields in declaration order, then the other files and the shards, sorted, indent 2."""
    one_file = dataclasses.replace(
        RECORD, source=dataclasses.replace(RECORD.source, files=RECORD.source.files[:1]), fallbacks=(), source_nonfinite={}
    )
    one_file = dataclasses.replace(one_file, hub=None, overrides=())
    dump_json(tmp_path / "p.json", one_file.document({"s2": "22", "s1": "11"}, {"s1": 1, "s2": 2}, {"z": "55", "a": "66"}, DATE,
                                                             {"s1": "33", "s2": "44"}))
    assert (tmp_path / "p.json").read_text(encoding="utf-8") == (
        '{\n  "tool": "ascendconv",\n  "version": "9.8.7",\n  "source": {\n    "name": "Kimi-K2",\n'
        '    "format": "hf-fp8-block",\n    "quantization_config": "text_config.quantization_config",\n'
        '    "params": {\n      "weight_block_size": [\n        128,\n        64\n      ]\n    },\n    "files": [\n      {\n        "name": "a.safetensors",\n        "size": 1234,\n'
        f'        "fingerprint": "{"ab" * 32}",\n        "tensor_sample": "{"ef" * 32}"\n      }}\n    ]\n  }},\n'
        '  "scheme": "w4a8-mxfp-moe",\n'
        '  "scale_rule": "floor",\n  "resolve_dtype": "fp16",\n  "kernel": "reference",\n  "fallbacks": [],\n'
        '  "source_nonfinite": {},\n  "checksum": "blake3",\n  "hub": null,\n  "deployment": {\n    "tp": 8,\n'
        '    "ep": true,\n    "shared_experts_as_routed": false,\n    "mtp_heads": false\n  },\n  "overrides": [],\n'
        f'  "command": "{RECORD.command}",\n  "added_tensors": {{}},\n  "date": "{DATE}",\n'
        '  "files": {\n    "a": "66",\n    "z": "55"\n  },\n'
        '  "shards": {\n    "s1": {\n      "blake3": "11",\n      "size": 1,\n      "source_data": "33"\n'
        '    },\n    "s2": {\n      "blake3": "22",\n      "size": 2,\n      "source_data": "44"\n    }\n  }\n}\n'
    )


def test_a_part_manifests_copy_gives_the_same_document():
    """assemble writes the provenance from the record's JSON kept in a part manifest: same document."""
    kept = json.loads(json.dumps(RECORD.base()))
    assert provenance_document(kept, DIGESTS, SIZES, FILES, DATE, READS) == RECORD.document(DIGESTS, SIZES, FILES, DATE, READS)
    assert list(RECORD.document(DIGESTS, SIZES, FILES, DATE, READS)) == (
        [f.name for f in dataclasses.fields(ProvenanceRecord)] + ["date", "files", "shards"]
    )


def test_a_package_written_before_source_formats_reads_as_block_fp8():
    """0.3's provenance records no format (it read only HF block FP8) and a top-level weight_block_size."""
    old = {"tool": "ascendconv", "source": {"name": "m", "quantization_config": "quantization_config",
                                            "weight_block_size": [128, 128], "files": []}}
    assert Provenance(old).source_format == "hf-fp8-block"
    assert Provenance({**old, "source": {**old["source"], "format": ["x"]}}).source_format is None


def test_the_settings_line_spells_what_the_file_holds_never_none():
    """verify's header and its provenance check said 'ascendconv None' for a version left out."""
    line = Provenance({"scheme": "w8a8-mxfp8", "scale_rule": None, "resolve_dtype": 16, "kernel": ["numba"]}).origin()
    assert line == 'ascendconv null, w8a8-mxfp8, rule null, resolve 16, kernel ["numba"]'
