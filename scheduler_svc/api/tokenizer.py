"""The scheduler's tokenizer: text <-> token ids and the chat template.

Built on the `tokenizers` library and jinja2 directly rather than on
transformers, so that the scheduler process never imports torch. It reads a
Hugging Face model directory: tokenizer.json, tokenizer_config.json and the
chat template (chat_template.jinja, or the config's `chat_template` key); a .gguf
file's are made into such a directory once (api/gguf_tokenizer.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from common.errors import InvalidArgument

CHAT_ROLES = ("system", "user", "assistant", "tool")


def _raise_template_error(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _token_text(value: object) -> str | None:
    # tokenizer_config.json stores special tokens as a string or as an AddedToken dict.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def with_tool_prompt(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The messages with the tools described at the end of the system message (one is
    added first if there is none): for templates that do not render tools."""
    listed = "\n".join(json.dumps(tool.get("function", tool)) for tool in tools)
    prompt = (
        "You can call these functions:\n"
        f"{listed}\n"
        'To call one, reply with only a JSON object: {"name": <function name>, '
        '"arguments": <its arguments as an object>}.'
    )
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{prompt}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


@dataclass(frozen=True)
class ChatTurn:
    role: str
    content: str


class Tokenizer:
    """Encodes prompts, renders chats, decodes ids; no torch involved."""

    def __init__(self, model_dir: str | Path) -> None:
        directory = Path(model_dir)
        name = directory.name
        if directory.suffix == ".gguf" and directory.is_file():
            from scheduler_svc.api.gguf_tokenizer import tokenizer_dir

            directory = tokenizer_dir(directory)  # the file's own tokenizer and template
        if not (directory / "tokenizer.json").exists():
            raise FileNotFoundError(
                f"no tokenizer.json in {directory}: the scheduler reads a Hugging Face model "
                "directory or a .gguf file"
            )
        self.name = name
        self._tokenizer = HFTokenizer.from_file(str(directory / "tokenizer.json"))
        config = self._read_json(directory / "tokenizer_config.json")
        generation = self._read_json(directory / "generation_config.json")
        self.bos_token = _token_text(config.get("bos_token")) or ""
        self.eos_token = _token_text(config.get("eos_token")) or ""
        self.eos_token_ids = self._eos_ids(generation)
        # The most characters one token can stand for (a byte-level vocabulary
        # spells each byte as one character, and a byte is at most a character):
        # a text longer than max_len * this cannot fit in max_len tokens, which
        # validation checks before spending time tokenizing it.
        self.max_token_chars = max(
            (len(token) for token in self._tokenizer.get_vocab(with_added_tokens=True)), default=1
        )
        self.special_token_ids = frozenset(
            token_id
            for token_id, token in self._tokenizer.get_added_tokens_decoder().items()
            if token.special
        )
        template_file = directory / "chat_template.jinja"
        template = (
            template_file.read_text() if template_file.exists() else config.get("chat_template")
        )
        self._chat_template = self._compile(template) if template else None
        # Templates that render tools themselves read the `tools` variable; for the
        # others, the tools are described in a system message (tool_prompt).
        self._template_reads_tools = bool(template) and "tools" in template

    @staticmethod
    def _read_json(path: Path) -> dict:
        return json.loads(path.read_text()) if path.exists() else {}

    def _eos_ids(self, generation: dict) -> tuple[int, ...]:
        ids: set[int] = set()
        configured = generation.get("eos_token_id")
        if isinstance(configured, int):
            ids.add(configured)
        elif isinstance(configured, list):
            ids.update(configured)
        if self.eos_token:
            token_id = self._tokenizer.token_to_id(self.eos_token)
            if token_id is not None:
                ids.add(token_id)
        return tuple(sorted(ids))

    @staticmethod
    def _compile(template: str) -> jinja2.Template:
        # The same environment settings transformers uses for chat templates.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
        env.globals["raise_exception"] = _raise_template_error
        return env.from_string(template)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def render_chat(
        self,
        turns: list[ChatTurn],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of a chat; tools are OpenAI `tools` entries ({"type":
        "function", "function": {...}}), given to the template; add_generation_prompt
        False leaves out the assistant turn's opening (HTTP's /tokenize asks it)."""
        if self._chat_template is None:
            raise InvalidArgument("chat", f"model {self.name} has no chat template; send a prompt")
        if not turns:
            raise InvalidArgument("chat.messages", "must hold at least one message")
        for index, turn in enumerate(turns):
            if turn.role not in CHAT_ROLES:
                raise InvalidArgument(
                    f"chat.messages[{index}].role",
                    f"must be one of {', '.join(CHAT_ROLES)}, got {turn.role!r}",
                )
        messages = [{"role": turn.role, "content": turn.content} for turn in turns]
        if tools and not self._template_reads_tools:
            messages = with_tool_prompt(messages, tools)
        try:
            return self._chat_template.render(
                messages=messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.exceptions.TemplateError as error:
            raise InvalidArgument(
                "chat.messages", f"rejected by the chat template: {error}"
            ) from error

    def encode_chat(self, turns: list[ChatTurn], tools: list[dict] | None = None) -> list[int]:
        # The template already contains the special tokens, as in transformers.
        return self.encode(self.render_chat(turns, tools), add_special_tokens=False)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (what llguidance builds its own from)."""
        return self._tokenizer.to_str()

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def id_to_token_text(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)
