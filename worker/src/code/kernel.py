# SandBase's code context: a Python interpreter whose state lives on between executions.
# It reads one JSON request per line on stdin ({"code": "..."}), runs it in one namespace, and
# writes JSON lines on its stdout: {"stdout": text}, {"stderr": text}, {"result": bundle,
# "main": bool}, {"exception": {"name", "value", "traceback"}}, then {"done": {"count": N}}.
# The program's own output (print, a subprocess) never mixes with these lines: descriptors 1
# and 2 are pipes read by threads of the kernel. SIGINT raises KeyboardInterrupt in the code
# running, and the context lives on.
import ast
import base64
import io
import json
import os
import sys
import threading
import traceback

PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
LOCK = threading.Lock()


def send(message):
    line = json.dumps(message, ensure_ascii=False)
    with LOCK:
        PROTOCOL.write(line + "\n")
        PROTOCOL.flush()


def pump(fd, name, drained):
    reader = os.fdopen(fd, "rb", buffering=0)
    while True:
        data = reader.read(65536)
        if not data:
            return
        marker = data.find(b"\x00SANDBASE_DRAIN\x00")
        if marker >= 0:
            before, after = data[:marker], data[marker + 16:]
            if before:
                send({name: before.decode("utf-8", "replace")})
            drained.set()
            data = after
        if data:
            send({name: data.decode("utf-8", "replace")})


DRAINED = {}
for number, name in ((1, "stdout"), (2, "stderr")):
    read_end, write_end = os.pipe()
    os.dup2(write_end, number)
    os.close(write_end)
    DRAINED[name] = threading.Event()
    threading.Thread(target=pump, args=(read_end, name, DRAINED[name]), daemon=True).start()
sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0, closefd=False), encoding="utf-8", line_buffering=True, write_through=True)
sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0, closefd=False), encoding="utf-8", line_buffering=True, write_through=True)


def drain():
    """Everything written so far on 1 and 2 is sent before the next line."""
    sys.stdout.flush()
    sys.stderr.flush()
    for number, name in ((1, "stdout"), (2, "stderr")):
        DRAINED[name].clear()
        os.write(number, b"\x00SANDBASE_DRAIN\x00")
    for name in ("stdout", "stderr"):
        DRAINED[name].wait(2)


def bundle(value):
    """The MIME bundle of a value: text always, an image or HTML when it has one."""
    shown = {"text/plain": repr(value)}
    figure = getattr(value, "savefig", None)
    if callable(figure):
        buffer = io.BytesIO()
        value.savefig(buffer, format="png", bbox_inches="tight")
        shown["image/png"] = base64.b64encode(buffer.getvalue()).decode()
    for method, mime in (("_repr_png_", "image/png"), ("_repr_html_", "text/html"), ("_repr_svg_", "image/svg+xml")):
        render = getattr(value, method, None)
        if callable(render):
            try:
                rendered = render()
            except Exception:
                continue
            if rendered is None:
                continue
            if isinstance(rendered, bytes):
                rendered = base64.b64encode(rendered).decode()
            shown[mime] = rendered
    return shown


def display(*values):
    drain()
    for value in values:
        send({"result": bundle(value), "main": False})


def show_figures():
    """Every open matplotlib figure, shown as an image and closed (as a notebook does)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for number in pyplot.get_fignums():
        display(pyplot.figure(number))
    pyplot.close("all")


def patch_show():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and getattr(pyplot.show, "__name__", "") != "show_figures":
        pyplot.show = lambda *args, **kwargs: show_figures()
        pyplot.show.__name__ = "show_figures"


os.environ.setdefault("MPLBACKEND", "Agg")
NAMESPACE = {"__name__": "__main__", "display": display}


def run(code):
    tree = ast.parse(code, "<code>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<code>", "exec"), NAMESPACE)
    patch_show()
    value = eval(compile(last, "<code>", "eval"), NAMESPACE) if last is not None else None
    patch_show()
    show_figures()
    if value is not None and not (hasattr(value, "savefig") and "matplotlib" in type(value).__module__):
        drain()
        send({"result": bundle(value), "main": True})


def main():
    count = 0
    while True:
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            request = json.loads(line)
            count += 1
            try:
                run(request["code"])
            except BaseException as error:  # noqa: BLE001 - the code's own, SystemExit included
                drain()
                # The code's own frames only, not the kernel's.
                frames = error.__traceback__
                while frames is not None and frames.tb_frame.f_code.co_filename != "<code>":
                    frames = frames.tb_next
                frames = traceback.format_exception(type(error), error, frames)
                send({"exception": {
                    "name": type(error).__name__,
                    "value": str(error),
                    "traceback": "".join(frames),
                }})
            drain()
            send({"done": {"count": count}})
        except KeyboardInterrupt:
            drain()
            send({"exception": {"name": "KeyboardInterrupt", "value": "", "traceback": ""}})
            send({"done": {"count": count}})


if __name__ == "__main__":
    main()
