package larder.interop;

import ai.vespa.feed.client.FeedClient;
import ai.vespa.feed.client.FeedClientBuilder;
import ai.vespa.feed.client.FeedException;
import ai.vespa.feed.client.JsonFeeder;
import ai.vespa.feed.client.Result;

import java.io.BufferedInputStream;
import java.io.InputStream;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Feeds a Vespa feed file (JSON array or JSON lines) to an endpoint with the real
 * vespa-feed-client library, the way its CLI does (JsonFeeder over FeedClient), and prints one
 * JSON line of results: {"ok":N,"failed":N,"seconds":S,"ops_per_sec":R,"errors":{...}}.
 *
 * Usage: Feed ENDPOINT FILE [CONNECTIONS [STREAMS_PER_CONNECTION [CA_CERTIFICATES]]]
 * (CA_CERTIFICATES: a PEM file of CAs to trust for an https:// endpoint, as the CLI's --ca-certificates).
 * Exit status 0 when every operation succeeded, 1 otherwise, 2 on a failed handshake.
 */
public class Feed {

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: Feed ENDPOINT FILE [CONNECTIONS [STREAMS_PER_CONNECTION [CA_CERTIFICATES]]]");
            System.exit(64);
        }
        URI endpoint = URI.create(args[0]);
        Path file = Path.of(args[1]);
        int connections = args.length > 2 ? Integer.parseInt(args[2]) : 8;
        int streams = args.length > 3 ? Integer.parseInt(args[3]) : 128;
        Path caCertificates = args.length > 4 ? Path.of(args[4]) : null;

        AtomicLong ok = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        ConcurrentHashMap<String, AtomicLong> errors = new ConcurrentHashMap<>();
        long start = System.nanoTime();
        FeedClient client;
        try {
            // build() performs the client's handshake (POST .../feeder/handshake/docid/dummy?dryRun=true).
            FeedClientBuilder builder = FeedClientBuilder.create(endpoint)
                                                         .setConnectionsPerEndpoint(connections)
                                                         .setMaxStreamPerConnection(streams);
            if (caCertificates != null) builder.setCaCertificatesFile(caCertificates);
            client = builder.build();
        } catch (FeedException e) {
            System.err.println("handshake failed: " + e.getMessage());
            System.exit(2);
            return;
        }
        try (InputStream in = new BufferedInputStream(Files.newInputStream(file), 1 << 16);
             JsonFeeder feeder = JsonFeeder.builder(client).withTimeout(Duration.ofSeconds(60)).build()) {
            feeder.feedMany(in, new JsonFeeder.ResultCallback() {
                @Override public void onNextResult(Result result, FeedException error) {
                    if (error == null && result.type() == Result.Type.success) {
                        ok.incrementAndGet();
                    } else {
                        failed.incrementAndGet();
                        String key = error != null ? error.getClass().getSimpleName() + ": " + error.getMessage()
                                                   : String.valueOf(result.type());
                        if (errors.size() < 20) errors.computeIfAbsent(key, k -> new AtomicLong()).incrementAndGet();
                    }
                }
                @Override public void onError(FeedException error) {
                    failed.incrementAndGet();
                    errors.computeIfAbsent("feed: " + error.getMessage(), k -> new AtomicLong()).incrementAndGet();
                }
            }).join();
        }
        double seconds = (System.nanoTime() - start) / 1e9;
        StringBuilder errorJson = new StringBuilder("{");
        errors.forEach((k, v) -> {
            if (errorJson.length() > 1) errorJson.append(',');
            errorJson.append('"').append(k.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " "))
                     .append("\":").append(v.get());
        });
        errorJson.append('}');
        System.out.printf("{\"ok\":%d,\"failed\":%d,\"seconds\":%.3f,\"ops_per_sec\":%.1f,\"errors\":%s}%n",
                          ok.get(), failed.get(), seconds, (ok.get() + failed.get()) / seconds, errorJson);
        System.exit(failed.get() == 0 ? 0 : 1);
    }
}
