"""An OpenAI-compatible server on the rollout engine (the `serve` extra: FastAPI + uvicorn).

server.py    `posttrain serve RUN_OR_MODEL`, and `Server` (uvicorn on a background thread)
app.py       the routes: /v1/chat/completions, /v1/completions, /v1/models; RL's episode rules
protocol.py  request bodies checked into prompts and sampling params; samples into replies
batcher.py   concurrent requests grouped into shared Engine.generate calls
records.py   the served tokens of each RL episode, and how they become training samples
"""
