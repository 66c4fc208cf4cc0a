"""Per-kind JSON schemas for kubeconform from a Kubernetes swagger.json (the k8s.io/kubernetes Go module ships
api/openapi-spec/swagger.json; no network beyond the Go module proxy is needed).

    python .ci/k8s_schemas.py SWAGGER_JSON OUT_DIR
writes OUT_DIR/<kind>[-<group>]-<version>.json (kubeconform's default file naming), $refs inlined, objects closed
(additionalProperties: false, as kubeconform's strict schemas) so a misspelled field fails validation.
"""

import json
import sys
from pathlib import Path

INT_OR_STRING = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
QUANTITY = {"oneOf": [{"type": "string"}, {"type": "number"}]}


def main(swagger: str, out: str) -> None:
    defs = json.loads(Path(swagger).read_text())["definitions"]
    Path(out).mkdir(parents=True, exist_ok=True)

    def inline(node: object, stack: tuple[str, ...]) -> object:
        if isinstance(node, list):
            return [inline(x, stack) for x in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.split("/")[-1]
            if name.endswith("intstr.IntOrString"):
                return INT_OR_STRING
            if name.endswith("resource.Quantity"):
                return QUANTITY
            if name in stack or len(stack) > 40:
                return {}
            return inline(defs[name], (*stack, name))
        out_node = {k: inline(v, stack) for k, v in node.items() if not k.startswith("x-kubernetes")}
        if node.get("format") == "int-or-string":
            return INT_OR_STRING
        if "properties" in out_node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out_node.setdefault("additionalProperties", False)
            out_node["properties"].setdefault("apiVersion", {"type": "string"})
            out_node["properties"].setdefault("kind", {"type": "string"})
        return out_node

    written = 0
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            group = gvk["group"].split(".")[0]
            fname = f"{gvk['kind'].lower()}{'-' + group if group else ''}-{gvk['version']}.json"
            schema = inline(d, (name,))
            assert isinstance(schema, dict)
            schema["$schema"] = "http://json-schema.org/schema#"
            (Path(out) / fname).write_text(json.dumps(schema))
            written += 1
    print(f"{written} schemas in {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
