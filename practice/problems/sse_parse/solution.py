def parse_sse(chunks: list[bytes]) -> list[str]:
    """The data payloads of an SSE byte stream cut into arbitrary chunks, up to [DONE]."""
    text = b"".join(chunks).decode("utf-8").replace("\r\n", "\n")
    payloads: list[str] = []
    data: list[str] = []
    for line in text.split("\n"):
        if line == "":
            if data:
                payload = "\n".join(data)
                if payload == "[DONE]":
                    return payloads
                payloads.append(payload)
            data = []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)
    return payloads
