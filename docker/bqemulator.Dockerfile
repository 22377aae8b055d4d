# The local BigQuery emulator, pinned as scripts/services.sh pins it (offline-safe spatial extension).
FROM python:3.11-slim
RUN pip install --no-cache-dir bqemulator==1.4.0 numpy duckdb==1.5.5 duckdb-extension-spatial==1.5.5 \
    && mkdir -p /root/.duckdb/extensions/v1.5.5/linux_amd64 \
    && cp /usr/local/lib/python3.11/site-packages/duckdb_extension_spatial/extensions/v1.5.5/spatial.duckdb_extension \
          /root/.duckdb/extensions/v1.5.5/linux_amd64/
EXPOSE 9050 9060
CMD ["bqemulator", "start", "--rest-host", "0.0.0.0", "--rest-port", "9050", "--grpc-host", "0.0.0.0", "--grpc-port", "9060", "--project", "filament-demo"]
