package dev.paystream.example;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A consumer of paystream's payment-state topic, the way docs/consumers.md says:
 *
 * <ul>
 *   <li>reads with {@code isolation.level=read_committed}: the sink writes in Kafka transactions,
 *       so nothing of an aborted one is ever returned;
 *   <li>deduplicates by event id: it keeps, per payment, the last version handled and skips an
 *       event at or below it (a relay that re-sent, a restart before a commit); versions are 1, 2,
 *       3... per payment, so a version that is not the last plus one is counted as out of order;
 *   <li>commits offsets only after the events of a poll were handled.
 * </ul>
 *
 * <p>It prints one line per transition and, when it stops (Ctrl-C, or with {@code --exit-at-end}
 * once every partition is read to the end it had when assigned), a JSON summary as its last line:
 *
 * <pre>
 * java -cp "target/paystream-example-consumer.jar:target/lib/*" dev.paystream.example.StateConsumer \
 *     --brokers 127.0.0.1:9092 --group my-team --exit-at-end
 * 2026-11-29T18:00:05Z acme:pay_123 v2 pending -> paid (capture 1050 BRL)
 * {"events":1,"payments":1,"duplicates":0,"out_of_order":0,"records":1}
 * </pre>
 *
 * <p>Here the last version per payment lives in memory, to show the rule; a real consumer stores
 * it (or a unique key on event_id) in the same transaction as its own effect.
 */
public final class StateConsumer {
  /** The value of a state record (schemas/payment-state.v1.json); unknown fields are ignored. */
  @JsonIgnoreProperties(ignoreUnknown = true)
  public record StateEvent(
      @JsonProperty("event_id") String eventId,
      @JsonProperty("payment_key") String paymentKey,
      @JsonProperty("version") long version,
      @JsonProperty("status") String status,
      @JsonProperty("previous_status") String previousStatus,
      @JsonProperty("kind") String kind,
      @JsonProperty("amount_minor") long amountMinor, // integer minor units: never a double
      @JsonProperty("currency") String currency,
      @JsonProperty("occurred_at") String occurredAt) {}

  private static final ObjectMapper JSON =
      new ObjectMapper().configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false);

  private final Map<String, Long> last = new HashMap<>();
  private long events, duplicates, outOfOrder, records;

  public static void main(String[] args) throws Exception {
    String brokers = "127.0.0.1:9092";
    String topic = "paystream.payments.state.v1";
    String group = "paystream-example-consumer-java";
    boolean exitAtEnd = false, quiet = false;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--brokers" -> brokers = args[++i];
        case "--topic" -> topic = args[++i];
        case "--group" -> group = args[++i];
        case "--exit-at-end" -> exitAtEnd = true;
        case "--quiet" -> quiet = true;
        default -> {
          System.err.println(
              "usage: StateConsumer [--brokers B] [--topic T] [--group G] [--exit-at-end] [--quiet]");
          System.exit(2);
        }
      }
    }
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    // The sink writes in Kafka transactions: never see an aborted one.
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    // Commit after handling, never before: at least once, then dedup.
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    // A new group starts with the oldest event kept.
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

    StateConsumer sc = new StateConsumer();
    try (KafkaConsumer<String, byte[]> consumer = new KafkaConsumer<>(p)) {
      AtomicBoolean stopped = new AtomicBoolean();
      Thread main = Thread.currentThread();
      Runtime.getRuntime()
          .addShutdownHook(
              new Thread(
                  () -> {
                    stopped.set(true);
                    consumer.wakeup();
                    try {
                      main.join(10_000);
                    } catch (InterruptedException e) {
                      Thread.currentThread().interrupt();
                    }
                  }));
      // With --exit-at-end: each assigned partition's end (its last stable offset, as
      // read_committed lists it) when it was assigned.
      Map<TopicPartition, Long> ends = new HashMap<>();
      consumer.subscribe(
          List.of(topic),
          new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> parts) {
              parts.forEach(ends::remove);
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> parts) {
              ends.putAll(consumer.endOffsets(parts));
            }
          });
      try {
        while (!stopped.get()) {
          ConsumerRecords<String, byte[]> polled = consumer.poll(Duration.ofSeconds(1));
          for (ConsumerRecord<String, byte[]> r : polled) {
            sc.handle(r, quiet);
          }
          if (!polled.isEmpty()) {
            consumer.commitSync();
          }
          if (exitAtEnd && !ends.isEmpty() && atEnd(consumer, ends)) {
            break;
          }
        }
      } catch (WakeupException e) {
        if (!stopped.get()) {
          throw e;
        }
      }
    }
    System.out.printf(
        "{\"events\":%d,\"payments\":%d,\"duplicates\":%d,\"out_of_order\":%d,\"records\":%d}%n",
        sc.events, sc.last.size(), sc.duplicates, sc.outOfOrder, sc.records);
  }

  private static boolean atEnd(KafkaConsumer<?, ?> consumer, Map<TopicPartition, Long> ends) {
    for (Map.Entry<TopicPartition, Long> e : ends.entrySet()) {
      if (consumer.position(e.getKey()) < e.getValue()) {
        return false;
      }
    }
    return true;
  }

  private void handle(ConsumerRecord<String, byte[]> r, boolean quiet) throws Exception {
    records++;
    String where = r.topic() + "/" + r.partition() + "/" + r.offset();
    StateEvent ev = JSON.readValue(r.value(), StateEvent.class);
    Header h = r.headers().lastHeader("event-id");
    String id = h == null ? "" : new String(h.value(), StandardCharsets.UTF_8);
    if (!id.equals(ev.eventId()) || !r.key().equals(ev.paymentKey())) {
      throw new IllegalStateException(
          "record " + where + ": event-id " + id + " or key " + r.key() + " differs from the value's");
    }
    long prev = last.getOrDefault(ev.paymentKey(), 0L);
    if (ev.version() <= prev) {
      duplicates++; // a redelivery: already handled
      return;
    }
    if (ev.version() != prev + 1) {
      outOfOrder++;
      System.err.println("out of order: " + ev.eventId() + " after version " + prev);
    }
    if (!quiet) {
      String from = ev.previousStatus().isEmpty() ? "(new)" : ev.previousStatus();
      System.out.printf(
          "%s %s v%d %s -> %s (%s %d %s)%n",
          ev.occurredAt(), ev.paymentKey(), ev.version(), from, ev.status(), ev.kind(),
          ev.amountMinor(), ev.currency());
    }
    last.put(ev.paymentKey(), ev.version());
    events++;
  }
}
