"""`python -m minisgl --model DIR [--port P] [--host H] [--api-key K] [--shell]`"""

from minisgl.server import launch_server, parse_args
from minisgl.utils import exit_on_error

if __name__ == "__main__":
    with exit_on_error():
        launch_server(parse_args())
