"""Real peers for the JWT/CORS e2e (PyJWT and cryptography from PyPI, not our code):

  serve IP PORT            an HTTP upstream answering every request with its headers (and its
                           path, as ":path") as JSON
  keys DIR NAME KIDS...    new keys (kid prefix es-/rs-/ed- picks ES256, RS256, EdDSA) into
                           DIR/NAME.jwks.json (public) and DIR/<kid>.pem (private)
  token DIR KID EXP [AUD]  a token signed with DIR/<kid>.pem, expiring EXP seconds from now
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ISSUER = "https://issuer.e2e"
ALG = {"es": "ES256", "rs": "RS256", "ed": "EdDSA"}


class Echo(BaseHTTPRequestHandler):
    def _answer(self):
        seen = {k.lower(): v for k, v in self.headers.items()}
        seen[":path"] = self.path  # no header has that name
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("access-control-allow-origin", "*")  # the proxy must replace this
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_OPTIONS = _answer

    def log_message(self, *args):
        pass


def new_key(kid):
    kind = kid.split("-")[0]
    if kind == "es":
        key = ec.generate_private_key(ec.SECP256R1())
        pub = jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    elif kind == "rs":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pub = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    else:
        key = ed25519.Ed25519PrivateKey.generate()
        pub = jwt.algorithms.OKPAlgorithm.to_jwk(key.public_key(), as_dict=True)
    pub.update({"kid": kid, "use": "sig"})
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return pub, pem


def main():
    cmd = sys.argv[1]
    if cmd == "serve":
        server = ThreadingHTTPServer((sys.argv[2], int(sys.argv[3])), Echo)
        print("echo listening", flush=True)
        server.serve_forever()
    elif cmd == "keys":
        d, name, kids = sys.argv[2], sys.argv[3], sys.argv[4:]
        keys = []
        for kid in kids:
            pub, pem = new_key(kid)
            keys.append(pub)
            open(f"{d}/{kid}.pem", "wb").write(pem)
        json.dump({"keys": keys}, open(f"{d}/{name}.jwks.json", "w"))
    elif cmd == "token":
        d, kid, exp = sys.argv[2], sys.argv[3], int(sys.argv[4])
        aud = sys.argv[5] if len(sys.argv) > 5 else "shop"
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": aud, "sub": "alice", "email": "alice@example.com", "iat": now, "exp": now + exp}
        pem = open(f"{d}/{kid}.pem", "rb").read()
        print(jwt.encode(claims, pem, algorithm=ALG[kid.split("-")[0]], headers={"kid": kid}))


if __name__ == "__main__":
    main()
