#!/usr/bin/env python3
"""Reference for test_chat_template.cpp: the real Jinja templates (chat_templates.json) rendered by
jinja2 the way transformers' apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks,
raise_exception).

  ref_chat.py TEMPLATES_JSON CASES_JSON OUT_JSON
      CASES_JSON: [{"template", "messages", "add_generation_prompt", "bos_token", "eos_token"}]
      OUT_JSON:   [{"ok": true, "text": ...} or {"ok": false, "error": ...}]
"""
import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def main(templates_path, cases_path, out_path):
    templates = json.load(open(templates_path, encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    out = []
    for c in json.load(open(cases_path, encoding="utf-8")):
        t = env.from_string(templates[c["template"]]["chat_template"])
        try:
            text = t.render(messages=c["messages"], add_generation_prompt=c["add_generation_prompt"],
                            bos_token=c["bos_token"], eos_token=c["eos_token"])
            out.append({"ok": True, "text": text})
        except TemplateError as e:
            out.append({"ok": False, "error": str(e)})
    json.dump(out, open(out_path, "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main(*sys.argv[1:4])
