"""Certificates for test servers, made with openssl for the run: a CA and a leaf it signed."""

import os
import subprocess


def run(*args):
    """Runs a command; its stderr in the error when it fails."""
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")


def issue(directory, names, usages="serverAuth"):
    """A CA and a certificate for `names` (host names or IP addresses) it signed, for the
    extended key `usages` (`serverAuth`, `serverAuth,clientAuth`): (CA path, chain path,
    key path), all PEM."""
    os.makedirs(directory, exist_ok=True)
    ca_key, ca = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.pem")
    key, request = os.path.join(directory, "key.pem"), os.path.join(directory, "leaf.csr")
    leaf, chain = os.path.join(directory, "leaf.pem"), os.path.join(directory, "chain.pem")
    extensions = os.path.join(directory, "leaf.ext")
    alt = ",".join(("IP:" if name.replace(".", "").isdigit() or ":" in name else "DNS:") + name
                   for name in names)
    with open(extensions, "w") as handle:
        handle.write(f"subjectAltName={alt}\nbasicConstraints=CA:FALSE\n"
                     f"keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage={usages}\n")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    run("openssl", "req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "2",
         "-subj", "/CN=Test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", *curve, "-keyout", key, "-out", request, "-subj", f"/CN={names[0]}")
    run("openssl", "x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key,
         "-CAcreateserial", "-out", leaf, "-days", "2", "-extfile", extensions)
    with open(chain, "w") as handle:
        handle.write(open(leaf).read() + open(ca).read())
    return ca, chain, key
