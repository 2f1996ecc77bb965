def verify(
    drafts: list[int], choices: list[int], eos: set[int], remaining: int
) -> tuple[list[int], int, str | None]:
    """The tokens a verify step emits, how many drafts were accepted, and why it finished."""
    accepted = 0
    for draft, choice in zip(drafts, choices):
        if draft != choice:
            break
        accepted += 1
    emitted: list[int] = []
    for token in choices[: accepted + 1]:
        emitted.append(token)
        if token in eos:
            return emitted, accepted, "stop"
        if len(emitted) >= remaining:
            return emitted, accepted, "length"
    return emitted, accepted, None
