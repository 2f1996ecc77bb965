"""The serving front: command-line arguments, the OpenAI-compatible API, launch and shell."""

from .args import ServerArgs, parse_args
from .launch import launch_server
