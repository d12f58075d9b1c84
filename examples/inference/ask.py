"""Ask the `chat` endpoint through the gateway with the official OpenAI client.

    python examples/inference/ask.py "What is the capital of France?"

The gateway's URL and your key are found as the CLI finds them: RESONTECH_GATEWAY_URL and
RESONTECH_API_KEY, else what `resontech login` saved.
"""

import sys

from openai import OpenAI

from gateway.client import resolve


def main() -> None:
    config = resolve()
    client = OpenAI(base_url=f"{config.url}/v1", api_key=config.key or "")
    question = " ".join(sys.argv[1:]) or "What is the capital of France?"
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": question}], max_tokens=64, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
