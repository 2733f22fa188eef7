"""Start-up cost: `import coreai` leaves heavy optional modules for when they are needed (issue 12:
`rfc3987_syntax`, pulled in by jsonschema's format checkers, took 3 s of a 7.7 s import), and the
tokenizer files are parsed once."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("jsonschema", "rfc3987_syntax")


def test_import_coreai_does_not_import_jsonschema():
    code = (
        f"import sys, json, coreai; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == []


def test_validation_still_works_after_a_lazy_import():
    code = (
        "import coreai\nfrom guided import check_json\nfrom guided.spec import check_metaschema\n"
        "print(check_json('{\"a\": \"x\"}', {'properties': {'a': {'type': 'integer'}}})[1])\n"
        "try:\n    check_metaschema({'type': 'strin'})\nexcept "
        "Exception as e:\n    print(type(e).__name__, e.pointer)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "'x' is not of type 'integer'" in out and "SchemaError /type" in out
