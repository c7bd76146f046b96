"""@libtorch: the headers and libraries of the torch wheel installed for `python3`.

The torch wheel ships LibTorch (include/, lib/). This repository rule asks that interpreter
where torch lives and whether it was built with the C++11 ABI, and links those directories
into the repository, so C++ targets build against exactly the torch the Python package uses
(as @system does for Debian's libraries). Nothing is downloaded: Bazel stays offline.

ACTPACK_PYTHON names another interpreter; the repository is refetched when it changes (or on
`bazel sync --configure`).
"""

def _libtorch_impl(ctx):
    python = ctx.os.environ.get("ACTPACK_PYTHON") or "python3"
    path = ctx.which(python) if "/" not in python else ctx.path(python)
    if path == None:
        fail("@libtorch: no %s on PATH to ask where torch is installed; set ACTPACK_PYTHON" % python)
    result = ctx.execute([path, "-c", "\n".join([
        "import os, torch",
        "print(os.path.dirname(torch.__file__))",
        "print(int(torch.compiled_with_cxx11_abi()))",
        "print(torch.__version__)",
    ])])
    if result.return_code != 0:
        fail("@libtorch: %s could not import torch (install it: bash tools/setup_env.sh):\n%s" %
             (path, result.stderr))
    root, abi, version = result.stdout.strip().split("\n")
    for sub in ("include", "lib"):
        if not ctx.path(root + "/" + sub).exists:
            fail("@libtorch: torch %s at %s has no %s/ directory; a wheel without LibTorch" %
                 (version, root, sub))
        ctx.symlink(root + "/" + sub, sub)
    ctx.template("BUILD", ctx.attr.build_file, {
        "%{cxx11_abi}": abi,
        "%{libdir}": root + "/lib",
        "%{version}": version,
    })

libtorch_repository = repository_rule(
    implementation = _libtorch_impl,
    attrs = {"build_file": attr.label(allow_single_file = True)},
    environ = ["ACTPACK_PYTHON", "PATH"],
    local = True,
)
