# Fusetune Studio on an NVIDIA GPU.
#   docker build -t fusetune .
#   docker run --gpus all -p 7860:7860 -e FUSETUNE_AUTH=me:secret -v fusetune:/data fusetune
FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    FUSETUNE_HOME=/data \
    FUSETUNE_HOST=0.0.0.0 \
    FUSETUNE_PORT=7860 \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /app
COPY requirements.txt requirements-builtin.txt ./
RUN pip install --no-cache-dir -r requirements.txt \
 && pip install --no-cache-dir --no-deps -r requirements-builtin.txt
COPY . .

RUN useradd --create-home --uid 1000 fusetune && mkdir -p /data && chown fusetune /data
USER fusetune
VOLUME /data
EXPOSE 7860
# Auth comes from FUSETUNE_AUTH=user:pass (app.py refuses a malformed value); set it when you publish the port.
CMD ["python3", "app.py", "--host", "0.0.0.0", "--port", "7860"]
