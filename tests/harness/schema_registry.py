"""A stand-in for a Confluent Schema Registry: no registry server installs here, so tests run
this small one. It implements only the documented REST subset that confluent-kafka's
SchemaRegistryClient calls for lagless and its tests, and Kafka Connect's AvroConverter (a
real Debezium registers its schemas here: tests/integration/test_mirror_avro.py): POST
/subjects/{s}/versions (register), GET /subjects, GET /schemas/ids/{id} and GET
/subjects/{s}/versions/latest, with the registry's 404 body for what it does not hold. No
compatibility checks, no auth."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SchemaRegistry:
    def __init__(self) -> None:
        self.schemas: list[str] = []  # by id - 1
        self.subjects: dict[str, list[int]] = {}
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                by_id = re.fullmatch(r"/schemas/ids/(\d+)", path)
                latest = re.fullmatch(r"/subjects/([^/]+)/versions/latest", path)
                if path == "/subjects":
                    self._send(200, list(registry.subjects))
                elif by_id and 0 < int(by_id[1]) <= len(registry.schemas):
                    self._send(200, {"schema": registry.schemas[int(by_id[1]) - 1]})
                elif latest and latest[1] in registry.subjects:
                    ids = registry.subjects[latest[1]]
                    body = {"subject": latest[1], "version": len(ids), "id": ids[-1]}
                    self._send(200, body | {"schema": registry.schemas[ids[-1] - 1]})
                else:
                    self._send(404, {"error_code": 40403, "message": "Schema not found"})

            def do_POST(self) -> None:
                match = re.fullmatch(r"/subjects/([^/]+)/versions", self.path.split("?")[0])
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert match, self.path
                self._send(200, {"id": registry.register(match[1], body["schema"])})

            def _send(self, status: int, body: dict[str, Any] | list[str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def register(self, subject: str, schema: str) -> int:
        if schema not in self.schemas:
            self.schemas.append(schema)
        schema_id = self.schemas.index(schema) + 1
        ids = self.subjects.setdefault(subject, [])
        if schema_id not in ids:
            ids.append(schema_id)
        return schema_id

    def __enter__(self) -> SchemaRegistry:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
