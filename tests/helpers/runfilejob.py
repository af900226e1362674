"""A tiny job with a run file: linejob's outputs, counted (``Sink.count``), and a list of every
output with its counts written once the run is finished (``Job.run_files``), as Megatron's
--data-path list would be. For tests of the manifest and of who writes a run's files."""

from __future__ import annotations

from fleet.job import RunManifest

from tests.helpers.linejob import LineConverter, LineJob

LIST = "outputs.txt"


class CountingConverter(LineConverter):
    def convert(self, documents, ctx, sink):
        stats = super().convert(documents, ctx, sink)
        sink.count(".txt", {"documents": stats["documents"], "lines": stats["lines"]})
        return stats


class RunFileJob(LineJob):
    name = "runfilejob"

    def document_converter(self, config, opener):
        return CountingConverter(config)

    def run_files(self, config, manifest: RunManifest) -> dict[str, bytes]:
        return {
            LIST: "".join(
                f"{counts.get('documents', 0)} {name}\n" for name, counts in manifest.outputs.items()
            ).encode()
        }


JOB = RunFileJob()
