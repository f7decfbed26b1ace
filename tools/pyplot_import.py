"""matplotlib for the drawing tools (plot-metrics.py, draw-schedule.py): the Agg backend, or, where this
interpreter lacks matplotlib, the same script run again by /usr/bin/python3 when that one has it (Debian's
python3-matplotlib, which tools/install-deps.sh installs), or a message saying how to install it."""
import os
import sys


def pyplot(tool):
    """matplotlib.pyplot, drawing to files; `tool` names the script in the message when there is none."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.path.exists(system) \
                and os.environ.get("PIPER_PLOT_REEXEC") is None:
            os.environ["PIPER_PLOT_REEXEC"] = "1"
            os.execv(system, [system] + sys.argv)
        sys.exit(f"{tool}: matplotlib is not installed: apt install python3-matplotlib, or pip install matplotlib")
