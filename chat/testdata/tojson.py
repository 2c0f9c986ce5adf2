#!/usr/bin/python3
"""Writes chat/testdata/tojson.json: Hugging Face's tojson filter
(transformers' chat_template_utils: json.dumps(x, ensure_ascii=False,
indent=None, separators=None, sort_keys=False), options passed through) on
each value below with each set of options, for chat's TestToJSONMatchesPython.

    /usr/bin/python3 chat/testdata/tojson.py > chat/testdata/tojson.json
"""
import json
import sys


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


values = [
    '{"type": "function", "function": {"name": "get_weather", "description": "Température en °C <b>&</b> \\"quoted\\" back\\\\slash", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}',
    '{"z": 1, "a": [1, 2.5, -0.0, 1e16, 1e-5, 0.1, 123456789.125, 1.5e300, 1.0, 100.0, 9007199254740993], "m": {"b": null, "a": true, "c": false}}',
    '[[], {}, [[]], {"e": {}}, "", 0]',
    '"control \\u0001 \\u001f \\u007f tab\\t nl\\n cr\\r bs\\b ff\\f sep\\u2028 emoji \\ud83d\\ude00 cjk 天气"',
    '{"é": "ü", "b": "x", "A": "y", "_": "z", "10": 1, "9": 2}',
    '3.14159',
    '-42',
    'null',
]
options = [
    {},
    {"indent": 4},
    {"indent": 2},
    {"indent": 0},
    {"indent": "\t"},
    {"ensure_ascii": True},
    {"ensure_ascii": True, "indent": 4},
    {"sort_keys": True},
    {"sort_keys": True, "indent": 2},
    {"separators": [",", ":"]},
    {"separators": [", ", " = "], "indent": 1},
]
cases = []
for v in values:
    x = json.loads(v)
    for o in options:
        kw = dict(o)
        if "separators" in kw:
            kw["separators"] = tuple(kw["separators"])
        cases.append({"value": v, "options": o, "output": tojson(x, **kw)})
json.dump({"command": "/usr/bin/python3 chat/testdata/tojson.py", "python": sys.version.split()[0], "cases": cases},
          sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
