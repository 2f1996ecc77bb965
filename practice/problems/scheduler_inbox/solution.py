def handle_all(msgs: list[tuple], max_seq_len: int) -> list[tuple]:
    """Act on user/abort/status/step messages in order; return every answer in order."""
    waiting: list[int] = []
    max_tokens: dict[int, int] = {}
    running: dict[int, int] = {}  # uid -> tokens still to generate
    answers: list[tuple] = []
    for msg in msgs:
        kind = msg[0]
        if kind == "user":
            _, uid, prompt_len, tokens = msg
            if prompt_len == 0 or prompt_len + tokens > max_seq_len:
                answers.append(("error", uid))
            else:
                waiting.append(uid)
                max_tokens[uid] = tokens
        elif kind == "abort":
            uid = msg[1]
            if uid in waiting:
                waiting.remove(uid)
            running.pop(uid, None)
        elif kind == "status":
            answers.append(("status", len(running), len(waiting)))
        elif kind == "step":
            for uid in waiting:
                running[uid] = max_tokens[uid]
            waiting.clear()
            for uid in list(running):
                running[uid] -= 1
                if running[uid] == 0:
                    del running[uid]
                    answers.append(("done", uid))
    return answers
