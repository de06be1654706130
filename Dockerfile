FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    RUNWATCH_DB=/data/runwatch.db RUNWATCH_CONFIG=/config/runwatch.toml

WORKDIR /app
# CPU torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY analyzers ./analyzers
COPY connectors ./connectors
COPY prompts ./prompts
RUN pip install .

RUN useradd --create-home --uid 10001 runwatch && mkdir -p /data /config \
    && chown runwatch /data
USER runwatch
VOLUME ["/data"]
EXPOSE 3000

ENTRYPOINT ["runwatch"]
CMD ["serve"]
