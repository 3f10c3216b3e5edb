"""The kernel command Jupyter starts: asks the sandbox's zygote for a kernel and stands in
for it. ``python -I -S launcher.py SOCKET REQUEST_JSON``; standard library only, so it
starts in milliseconds. SIGINT is relayed (an interrupt); SIGTERM or this process dying
(SIGKILL) kills the kernel and everything it started. When the kernel has ended, the
zygote's report of how (exit code, signal, who killed it, memory) is written to the
request's ``status_file``, outside the jail, for the grader; the exit code is the
kernel's (128 + signal when a signal ended it)."""

import json
import signal
import socket
import sys


def main(socket_path, request_json):
    status_file = json.loads(request_json)["status_file"]
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
        chunk = conn.recv(4096)
        if not chunk:
            break
        reply += chunk
    try:
        report = json.loads(reply)
    except ValueError:  # the zygote's child died before it could report
        report = {"exit_code": None, "signal": None, "lost": True}
    with open(status_file, "w") as f:
        json.dump(report, f)
    if report.get("signal"):
        return 128 + report["signal"]
    return report.get("exit_code") or (0 if not report.get("lost") else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
