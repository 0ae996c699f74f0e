"""Chat templates of the formats `reinforge model --arch` writes beside its models (models/archs.py).

The vocab-only GGUF files (models/vocabs.py) carry at most a minimal template: Qwen2's is plain
ChatML (no `tools=`, no reasoning blocks), Llama 3's file has none. These are reinforge's own
Jinja templates of the public formats, written here; they are not the model vendors' files, so
wording (the tool instructions) and corner cases differ from the released tokenizers:

    CHATML_TOOLS   Qwen2.5's format: ChatML with a default system turn, `tools=` listed in the
                   system turn inside <tools></tools>, calls as <tool_call>{json}</tool_call>,
                   tool results as a user turn of <tool_response> blocks. Without tools it
                   renders exactly as the GGUF's ChatML template.
    QWEN3          the same plus Qwen3's reasoning: no default system turn; an assistant turn's
                   `<think>...</think>` is kept after the last user message and dropped before
                   it; `enable_thinking=False` opens the reply with an empty think block.
    LLAMA3         Llama 3's headers: <|begin_of_text|>, then each message as
                   <|start_header_id|>role<|end_header_id|>\\n\\n content <|eot_id|>; a tool
                   result is the `ipython` role. It refuses `tools=` (no tool format is written
                   for Llama here) rather than silently dropping them.

Every template appends: rendering a conversation and then a longer one starting with it gives
the first text as a prefix (what the agent loop's hermes parser and SFT's turn split rely on).
HF renders with trim_blocks and lstrip_blocks; every tag here trims with `-` so the output is
only the quoted strings.
"""
from __future__ import annotations

_CHATML_MESSAGES = """\
{%- for m in rest -%}
  {%- if m['role'] == 'tool' -%}
    {%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' -}}
    {%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- else -%}
    {%- set content = m['content'] or '' -%}
    {%- if THINKING and m['role'] == 'assistant' and '</think>' in content and loop.index0 < last_user -%}
      {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {{- '<|im_start|>' + m['role'] + '\\n' + content -}}
    {%- if m['role'] == 'assistant' and m.get('tool_calls') -%}
      {%- for call in m['tool_calls'] -%}
        {%- set f = call['function'] if call.get('function') else call -%}
        {%- set args = f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) -%}
        {{- ('\\n' if (content or not loop.first) else '') + '<tool_call>\\n{"name": "' + f['name']
            + '", "arguments": ' + args + '}\\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if THINKING and enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}"""

_TOOLS_BLOCK = """\
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nThe functions you may call are listed inside <tools></tools>, one JSON schema a line:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nTo call a function, write its name and arguments as one JSON object inside '
      + '<tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
      + '<args-json-object>}\\n</tool_call>' -}}
{%- endif -%}"""

_HEAD = """\
{%- set has_system = messages and messages[0]['role'] == 'system' -%}
{%- set rest = messages[1:] if has_system else messages -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in rest -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- set last_user = ns.last_user -%}
"""

CHATML_TOOLS = ("{%- set THINKING = false -%}" + _HEAD
                + "{{- '<|im_start|>system\\n' + (messages[0]['content'] if has_system else 'You are a helpful assistant') -}}"
                + _TOOLS_BLOCK + "{{- '<|im_end|>\\n' -}}" + _CHATML_MESSAGES)

QWEN3 = ("{%- set THINKING = true -%}" + _HEAD
         + "{%- if has_system or tools -%}"
         + "{{- '<|im_start|>system\\n' + (messages[0]['content'] if has_system else '') -}}"
         + _TOOLS_BLOCK.replace("'\\n\\n# Tools", "('\\n\\n' if has_system else '') + '# Tools")
         + "{{- '<|im_end|>\\n' -}}{%- endif -%}" + _CHATML_MESSAGES)

LLAMA3 = """\
{%- if tools -%}{{- raise_exception('this Llama 3 chat template renders no tools= (reinforge writes no Llama tool format); use a Qwen architecture for tool calls') -}}{%- endif -%}
{{- bos_token -}}
{%- for m in messages -%}
  {{- '<|start_header_id|>' + ('ipython' if m['role'] == 'tool' else m['role']) + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"""

TEMPLATES = {"chatml_tools": CHATML_TOOLS, "qwen3": QWEN3, "llama3": LLAMA3}
