"""The kernel command Jupyter starts: asks the sandbox's zygote for a kernel and stands in
for it. ``python -I -S launcher.py SOCKET REQUEST_JSON``; standard library only, so it
starts in milliseconds. SIGINT is relayed (an interrupt); SIGTERM or this process dying
(SIGKILL) kills the kernel and everything it started. Exits with the kernel's exit code."""

import signal
import socket
import sys


def main(socket_path, request_json):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    conn.sendall(request_json.encode() + b"\n")

    def relay(signum, frame):
        try:
            conn.sendall(b"I" if signum == signal.SIGINT else b"K")
        except OSError:
            pass

    signal.signal(signal.SIGINT, relay)
    signal.signal(signal.SIGTERM, relay)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            break
        reply += chunk
    try:
        return int(reply.strip())
    except ValueError:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
