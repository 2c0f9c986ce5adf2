#!/usr/bin/python3
"""The oracle of chat's Jinja tests: renders every template of templates/
with every conversation of conversations.json as Hugging Face's
apply_chat_template renders it, with Python's Jinja2, and writes the
outputs to rendered.json, which TestJinjaCorpus compares kvlm's renderer
against byte for byte.

Run from the repository root (Debian's python3-jinja2):

    /usr/bin/python3 chat/testdata/render.py > chat/testdata/rendered.json

or `go test ./chat/ -run TestJinjaOracle -jinja-oracle`, which runs it and
fails if rendered.json differs from what it writes.

The environment is the one transformers builds for chat templates
(transformers/utils/chat_template_utils.py, _compile_jinja_template):
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension and the {% generation %} tag; a tojson filter that is
json.dumps with ensure_ascii=False (and its indent, separators and
sort_keys); the globals raise_exception and strftime_now. The variables are
those apply_chat_template passes: messages, tools (None without tools),
documents (None), add_generation_prompt, and the special tokens bos_token
and eos_token. strftime_now formats the fixed time conversations.json names,
so that the outputs do not depend on the day they were made.
"""

import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}…{% endgeneration %}: renders its body (transformers
    uses it to find the assistant's tokens; the text is unchanged)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def environment(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        spec = json.load(f)
    now = datetime.datetime.fromisoformat(spec["now"])
    env = environment(now)
    tdir = os.path.join(HERE, "templates")
    names = sorted(n for n in os.listdir(tdir) if n.endswith(".jinja"))
    cases = []
    for name in names:
        with open(os.path.join(tdir, name), encoding="utf-8") as f:
            src = f.read()
        try:
            tmpl = env.from_string(src)
        except jinja2.exceptions.TemplateError as e:
            cases.append({"template": name, "conversation": "", "error": f"{type(e).__name__}: {e}"})
            continue
        for conv in spec["conversations"]:
            if conv.get("when") and conv["when"] not in src:
                continue
            case = {"template": name, "conversation": conv["name"]}
            try:
                case["output"] = tmpl.render(
                    messages=conv["messages"],
                    tools=spec["tools"] if conv.get("tools") else None,
                    documents=None,
                    add_generation_prompt=conv["add_generation_prompt"],
                    bos_token=spec["bos_token"],
                    eos_token=spec["eos_token"],
                )
            except Exception as e:  # what apply_chat_template would raise
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    out = {
        "comment": "Written by render.py (see its docstring); do not edit by hand.",
        "command": "/usr/bin/python3 chat/testdata/render.py > chat/testdata/rendered.json",
        "jinja2": jinja2.__version__,
        "python": sys.version.split()[0],
        "cases": cases,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
