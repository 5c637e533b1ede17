# The image the Helm chart and deploy/kubernetes/daemonset.yaml run (gpuwear:0.1.0):
#   docker build -t gpuwear:0.1.0 .
# NVML comes from the node's driver, injected by the NVIDIA container toolkit
# (runtimeClassName: nvidia, NVIDIA_DRIVER_CAPABILITIES=utility); the image holds no driver.
# The kubernetes extra (grpcio) names pods through the kubelet's pod-resources API; isal gzips scrapes.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 NVIDIA_DRIVER_CAPABILITIES=utility
COPY pyproject.toml README.md config.yaml /src/
COPY daemon /src/daemon
RUN pip install "/src[kubernetes,isal]" && rm -rf /src \
    && groupadd --gid 9941 gpuwear && useradd --uid 9941 --gid 9941 --no-create-home --shell /usr/sbin/nologin gpuwear \
    && mkdir -p /var/lib/gpuwear /etc/gpuwear && chown 9941:9941 /var/lib/gpuwear
USER 9941:9941
ENV STATE_DIRECTORY=/var/lib/gpuwear
EXPOSE 9941
ENTRYPOINT ["gpuwear"]
CMD ["run", "--config", "/etc/gpuwear/config.yaml"]
