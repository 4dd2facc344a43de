"""`teacher.mode: batch`: the rows not cached go to the OpenAI Batch API as one job, at half the list price.

The job is the SDK's: the requests as a JSONL file (`files.create`, purpose batch), `batches.create`
(`/v1/chat/completions`, completion window 24h), `batches.retrieve` until the job ends, then `files.content`
of its output and error files. Each line carries the synchronous request's body, and its `custom_id` is the
call's cache key, so an answered row is cached exactly like a synchronous call: a later sync run hits it too.

Nothing is paid twice: a job's state (its call keys, input file id, batch id) is written atomically under
`<teacher.cache_dir>/batches/` before and after `batches.create`, so a run killed while it waits (also with
kill -9) resumes polling the same job; a kill between the upload and the id being written is found again by
the input file id in `batches.list`. Keys an unfinished job already holds are never submitted again. Rows the
job did not answer (its error file, an expired or failed job) are left uncached: the stage retries them
synchronously, in the same run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from pathlib import Path

from ..errors import QrewriteError, ServiceUnavailable
from ..io_utils import read_json, write_json
from ..openai_chat import CallFailed

log = logging.getLogger("qrewrite.teacher")

ENDPOINT = "/v1/chat/completions"
TERMINAL = ("completed", "failed", "expired", "cancelled")


class BatchJobs:
    """The Batch API jobs of one teacher (an OpenAITeacher) and its cache."""

    def __init__(self, teacher, cache, bcfg: dict, cache_dir: str):
        self.teacher, self.cache, self.cfg = teacher, cache, bcfg
        self.dir = Path(cache_dir) / "batches"
        self.client = teacher.client

    def _path(self, job: dict) -> Path:
        return self.dir / f"{job['local_id']}.json"

    def _save(self, job: dict) -> None:
        # atomic: a kill leaves the old state or the new one; "_" keys live only in this run
        write_json(self._path(job), {k: v for k, v in job.items() if not k.startswith("_")})

    def open_jobs(self) -> list[dict]:
        """Jobs submitted (or being submitted) by an earlier run and not yet collected."""
        jobs = [read_json(p) for p in sorted(self.dir.glob("*.json"))] if self.dir.is_dir() else []
        return [j for j in jobs if j["status"] != "collected"]

    async def _api(self, request):
        """One Batch API call with the teacher's retry policy; a refusal stops the stage (nothing to retry)."""
        try:
            out, _, _ = await self.teacher.retrying(request)
        except CallFailed as exc:
            if exc.transient:
                raise ServiceUnavailable(f"Batch API {self.teacher.base_url}: {exc.reason}",
                                         hint="rerun: a submitted job is polled again, not paid twice") from None
            raise QrewriteError(f"Batch API {self.teacher.base_url} refused the request: {exc.reason}",
                                hint="teacher.mode: sync calls the chat API row by row instead") from None
        return out

    async def run(self, pending: dict[str, list[dict]]) -> dict:
        """Submit the keys of `pending` (call key → messages) that no unfinished job holds, wait for every
        unfinished job, cache what they answered. Returns this run's counts for the stage's stats."""
        jobs = self.open_jobs()
        held = {k for j in jobs for k in j["keys"]}
        new = [k for k in pending if k not in held]
        size = int(self.cfg["max_requests"])
        for i in range(0, len(new), size):
            jobs.append(self._new_job({k: pending[k] for k in new[i:i + size]}))
        done = await asyncio.gather(*(self._finish(job) for job in jobs))
        return {"jobs": [j["batch_id"] for j in jobs], "submitted": sum(1 for j in jobs if j.get("_new")),
                "answered": sum(a for a, _ in done), "failed": sum(f for _, f in done)}

    def _new_job(self, requests: dict[str, list[dict]]) -> dict:
        keys = sorted(requests)
        local_id = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
        job = {"local_id": local_id, "model": self.teacher.model, "keys": keys, "status": "new",
               "input_file_id": None, "batch_id": None, "created": time.time(), "_new": True}
        body = "".join(json.dumps({"custom_id": k, "method": "POST", "url": ENDPOINT,
                                   "body": self.teacher.request_body(requests[k])}, ensure_ascii=False) + "\n"
                       for k in keys)
        job["_input"] = body.encode("utf-8")
        return job

    async def _submit(self, job: dict) -> None:
        """Upload the requests and create the job, recording each id the moment it exists."""
        if job["input_file_id"] is None:
            data = job.pop("_input")
            f = await self._api(lambda: self.client.files.create(
                file=(f"qrewrite-teacher-{job['local_id']}.jsonl", data, "application/jsonl"), purpose="batch"))
            job.update(input_file_id=f.id, status="uploaded")
            self._save(job)
        else:  # killed after the upload: was the job created before its id could be written? (newest first)
            page = await self._api(lambda: self.client.batches.list(limit=100))
            for b in page.data:
                if b.input_file_id == job["input_file_id"]:
                    job.update(batch_id=b.id, status="submitted")
                    self._save(job)
                    log.info("teacher batch %s: found job %s of input file %s", job["local_id"], b.id,
                             job["input_file_id"])
                    return
        b = await self._api(lambda: self.client.batches.create(
            input_file_id=job["input_file_id"], endpoint=ENDPOINT, completion_window=self.cfg["completion_window"],
            metadata={"qrewrite": f"teacher {job['local_id']}"}))
        job.update(batch_id=b.id, status="submitted")
        self._save(job)
        log.info("teacher batch: submitted %s (%d requests, input file %s)", b.id, len(job["keys"]),
                 job["input_file_id"])

    async def _finish(self, job: dict) -> tuple[int, int]:
        """Poll `job` until it ends, cache its answers; (rows answered, rows failed)."""
        if job["batch_id"] is None:  # new, or uploaded by a run killed before batches.create answered
            await self._submit(job)
        else:
            log.info("teacher batch: resuming %s (%d requests)", job["batch_id"], len(job["keys"]))
        while True:
            b = await self._api(lambda: self.client.batches.retrieve(job["batch_id"]))
            if b.status in TERMINAL:
                break
            counts = b.request_counts
            log.info("teacher batch %s: %s, %s of %s done", b.id, b.status, counts.completed if counts else "?",
                     counts.total if counts else "?")
            await asyncio.sleep(float(self.cfg["poll_s"]))
        if b.status != "completed":
            log.warning("teacher batch %s ended %s%s: its unanswered rows are retried synchronously", b.id,
                        b.status, f" ({b.errors})" if b.errors else "")
        answered = failed = 0
        keys = set(job["keys"])
        for file_id in (b.output_file_id, b.error_file_id):
            if not file_id:
                continue
            content = await self._api(lambda: self.client.files.content(file_id))
            for line in content.text.splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                if row.get("custom_id") not in keys:
                    continue
                if self._take(row, b.id):
                    answered += 1
                else:
                    failed += 1
        job.update(status="collected", batch_status=b.status, answered=answered, failed=failed)
        self._save(job)
        return answered, failed

    def _take(self, row: dict, batch_id: str) -> bool:
        """Cache one output line's answer (True), or log why the row has none (False: retried synchronously)."""
        from openai.types.chat import ChatCompletion
        from pydantic import ValidationError

        response = row.get("response") or {}
        body = response.get("body") or {}
        if response.get("status_code") != 200:
            err = body.get("error") or row.get("error") or {}
            log.info("teacher batch %s: row %s failed: HTTP %s %s", batch_id, row["custom_id"][:12],
                     response.get("status_code"), str(err.get("message", err))[:200])
            return False
        try:
            out = self.teacher.reply(ChatCompletion.model_validate(body))
        except (CallFailed, ValidationError) as exc:
            log.info("teacher batch %s: row %s has no rewrite: %s", batch_id, row["custom_id"][:12],
                     getattr(exc, "reason", exc))
            return False
        out.update(latency_s=None, attempts=1, batch_id=batch_id,
                   cost_usd=self.teacher.cost(out["usage"], batch=True))
        self.cache.put(row["custom_id"], out)
        return True
