"""InferencePool (inference.networking.k8s.io/v1) checked against the fields of the extension's API reference
(gateway-api-inference-extension.sigs.k8s.io/reference/spec, api/v1/inferencepool_types.go): no npm or PyPI
package publishes its CRD schema, so this schema is written from that reference. A weaker check than the
published-schema ones (render.crdvalidate): it is only as right as this transcription; it is strict about field
names and required fields, and checks the documented limits (ports 1–65535, 1–8 unique targetPorts,
appProtocol and failureMode enums).
"""
from __future__ import annotations

_PORT = {"type": "object", "additionalProperties": False, "required": ["number"],
         "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"}, "kind": {"const": "InferencePool"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "additionalProperties": False,
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False, "required": ["matchLabels"],
                             "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                            "additionalProperties": {"type": "string"}}}},
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "uniqueItems": True, "items": _PORT},
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "endpointPickerRef": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
                                   "port": _PORT, "failureMode": {"enum": ["FailOpen", "FailClose"]}},
                    # port is required when kind is Service (the default)
                    "if": {"not": {"required": ["kind"]}}, "then": {"required": ["port"]}},
            }},
    }}


def pool_problems(doc: dict) -> list[str]:
    """Every difference of ``doc`` from SCHEMA, as ``path: message`` lines (empty: it conforms)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


__all__ = ["SCHEMA", "pool_problems"]
