ROLES = ("system", "user", "assistant")


def block(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def render_chatml(
    messages: list[dict[str, str]], default_system: str, add_generation_prompt: bool
) -> str:
    """The ChatML text of a conversation, with a default system message if none leads it.

    ValueError for an unknown role, or a system message that is not the first.
    """
    parts = []
    if not messages or messages[0]["role"] != "system":
        parts.append(block("system", default_system))
    for i, message in enumerate(messages):
        if message["role"] not in ROLES:
            raise ValueError(f"unknown role {message['role']!r}")
        if message["role"] == "system" and i > 0:
            raise ValueError("a system message must come first")
        parts.append(block(message["role"], message["content"]))
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)
