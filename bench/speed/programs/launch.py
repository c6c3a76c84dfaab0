"""Start the commands given as a JSON list of argv lists all at once, wait for all,
and print one JSON object: the wall time from the first start to the last exit,
the largest peak RSS among them (KiB) and their exit codes.

The bench runs this small process to start the measured ones because a process's
peak RSS includes the memory of the process it was forked from: forked from the
bench itself, every program would weigh at least what the bench weighs.
Their stdout is discarded; their stderr is this process's.
"""

import json
import os
import sys
import time


def main() -> None:
    argvs = json.loads(sys.argv[1])
    devnull = os.open(os.devnull, os.O_RDWR)
    began = time.perf_counter()
    pids = []
    for argv in argvs:
        pid = os.fork()
        if pid == 0:
            try:
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.execvp(argv[0], argv)
            finally:
                os._exit(127)
        pids.append(pid)
    codes, rss = [], 0
    for pid in pids:
        _, status, usage = os.wait4(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
        rss = max(rss, usage.ru_maxrss)
    seconds = time.perf_counter() - began
    print(json.dumps({"seconds": seconds, "max_rss_kb": rss, "exit_codes": codes}))


if __name__ == "__main__":
    main()
