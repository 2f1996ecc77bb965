def render_chatml(
    messages: list[dict[str, str]], default_system: str, add_generation_prompt: bool
) -> str:
    """The ChatML text of a conversation, with a default system message if none leads it.

    ValueError for an unknown role, or a system message that is not the first.
    """
    raise NotImplementedError("write each message as a ChatML block")
