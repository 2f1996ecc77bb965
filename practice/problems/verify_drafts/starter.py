def verify(
    drafts: list[int], choices: list[int], eos: set[int], remaining: int
) -> tuple[list[int], int, str | None]:
    """The tokens a verify step emits, how many drafts were accepted, and why it finished."""
    raise NotImplementedError("accept the agreeing prefix, emit it and one more, stop at EOS")
