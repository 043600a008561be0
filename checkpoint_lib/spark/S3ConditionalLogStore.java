package io.checkpointlib.delta;

import io.delta.storage.S3SingleDriverLogStore;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Abortable;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta LogStore for S3A that makes commits multi-writer safe by using S3 conditional writes
 * ({@code PUT ... If-None-Match: *}) instead of the JVM-local lock + existence probe of
 * {@link S3SingleDriverLogStore}.
 *
 * <p>Requires Hadoop 3.5+ (HADOOP-19256): {@code FileSystem.createFile(path)} with the builder option
 * {@code fs.option.create.conditional.overwrite=true} makes S3A send {@code If-None-Match: *}; a
 * {@code 412 PreconditionFailed} is surfaced by S3A as {@code org.apache.hadoop.fs.s3a.RemoteFileChangedException}
 * (no retry). This class maps it to {@link java.nio.file.FileAlreadyExistsException}, which Delta's
 * OptimisticTransaction treats as "another writer won this version": it re-reads the log, checks for
 * logical conflicts and retries at the next version (or fails with a ConcurrentModificationException).
 *
 * <p>Enable with {@code spark.delta.logStore.s3a.impl=io.checkpointlib.delta.S3ConditionalLogStore}
 * (and/or {@code .s3.impl}). Reads and listing are inherited from S3SingleDriverLogStore (so
 * {@code delta.enableFastS3AListFrom} still works). Writes with {@code overwrite=true}
 * (e.g. {@code _last_checkpoint}) are delegated unchanged.
 *
 * <p>Hadoop configuration (from the Delta hadoop conf, i.e. {@code spark.hadoop.*} or Delta table options):
 * <ul>
 *   <li>{@code io.checkpointlib.delta.requireConditionalCreate} (default {@code true}): if the file system does not
 *       report the path capability {@code fs.option.create.conditional.overwrite} (non-S3A store, or
 *       {@code fs.s3a.create.conditional.enabled=false}) the write fails instead of silently falling back to
 *       the unsafe single-driver behaviour. Set to false to fall back.</li>
 * </ul>
 *
 * <p>Idempotency: the SDK may retry a PUT whose first attempt actually succeeded (response lost); the retry
 * then gets 412. To avoid reporting our own successful commit as a lost race (which would make Delta
 * re-commit a blind append at the next version = duplicate data), on 412 the existing object is read back
 * and compared byte-for-byte with what we tried to write; if identical the write counts as successful.
 */
public class S3ConditionalLogStore extends S3SingleDriverLogStore {

    /** org.apache.hadoop.fs.Options.CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE (Hadoop 3.5). */
    public static final String CONDITIONAL_OVERWRITE = "fs.option.create.conditional.overwrite";

    public static final String REQUIRE_CONDITIONAL_KEY = "io.checkpointlib.delta.requireConditionalCreate";

    private static final String REMOTE_FILE_CHANGED = "org.apache.hadoop.fs.s3a.RemoteFileChangedException";

    public S3ConditionalLogStore(Configuration initHadoopConf) {
        super(initHadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        if (Boolean.TRUE.equals(overwrite)) {
            super.write(path, actions, overwrite, hadoopConf);
            return;
        }
        FileSystem fs = path.getFileSystem(hadoopConf);
        Path resolved = fs.makeQualified(path);
        if (!fs.hasPathCapability(resolved, CONDITIONAL_OVERWRITE)) {
            if (hadoopConf.getBoolean(REQUIRE_CONDITIONAL_KEY, true)) {
                throw new IOException("S3ConditionalLogStore: file system " + fs.getUri()
                        + " does not support conditional create (path capability " + CONDITIONAL_OVERWRITE
                        + " is false; needs Hadoop >= 3.5 S3A with fs.s3a.create.conditional.enabled=true). Set "
                        + REQUIRE_CONDITIONAL_KEY + "=false to fall back to S3SingleDriverLogStore.");
            }
            super.write(path, actions, overwrite, hadoopConf);
            return;
        }

        // Serialise first: commits are small, and we need the bytes for the idempotency check on 412.
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            buf.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
        byte[] body = buf.toByteArray();

        FSDataOutputStream out = null;
        try {
            out = (FSDataOutputStream) fs.createFile(resolved)
                    .overwrite(false)
                    .recursive()
                    .must(CONDITIONAL_OVERWRITE, true)
                    .build();
            try {
                out.write(body);
                onBeforeClose(resolved);
            } catch (IOException | RuntimeException | Error e) {
                abortQuietly(out);
                out = null;
                throw e;
            }
            FSDataOutputStream toClose = out;
            out = null;
            toClose.close(); // the (conditional) PUT happens here
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            // S3A's own probe (or a non-conditional code path) saw the object already
            throw alreadyExists(resolved, e);
        } catch (IOException e) {
            if (isPreconditionFailed(e)) {
                if (sameContent(fs, resolved, body)) {
                    return; // our own earlier attempt landed (SDK retry after a lost response)
                }
                throw alreadyExists(resolved, e);
            }
            throw e;
        }
    }

    /** Test hook: called after the data is written to the stream and before close() issues the PUT. */
    protected void onBeforeClose(Path path) throws IOException {
    }

    private static FileAlreadyExistsException alreadyExists(Path path, Throwable cause) {
        FileAlreadyExistsException fae = new FileAlreadyExistsException(path.toUri().toString(), null,
                "conditional create lost the race: " + cause);
        fae.initCause(cause);
        return fae;
    }

    static boolean isPreconditionFailed(Throwable t) {
        for (int depth = 0; t != null && depth < 16; depth++, t = t.getCause()) {
            if (REMOTE_FILE_CHANGED.equals(t.getClass().getName())) {
                return true;
            }
            String msg = String.valueOf(t.getMessage());
            if (msg.contains("PreconditionFailed") || msg.contains("Status Code: 412")) {
                return true;
            }
            try { // software.amazon.awssdk.awscore.exception.AwsServiceException#statusCode(), without a compile dep
                Object code = t.getClass().getMethod("statusCode").invoke(t);
                if (code instanceof Integer && (Integer) code == 412) {
                    return true;
                }
            } catch (ReflectiveOperationException | RuntimeException ignored) {
                // not an SDK service exception
            }
        }
        return false;
    }

    private static boolean sameContent(FileSystem fs, Path path, byte[] expected) {
        try (FSDataInputStream in = fs.open(path)) {
            byte[] actual = readAll(in, expected.length + 1);
            return Arrays.equals(actual, expected);
        } catch (IOException | RuntimeException e) {
            return false;
        }
    }

    private static byte[] readAll(InputStream in, int limit) throws IOException {
        ByteArrayOutputStream bos = new ByteArrayOutputStream();
        byte[] b = new byte[8192];
        int n;
        while ((n = in.read(b)) > 0) {
            bos.write(b, 0, n);
            if (bos.size() > limit) {
                break;
            }
        }
        return bos.toByteArray();
    }

    private static void abortQuietly(FSDataOutputStream out) {
        // Never close() here: for S3A, close() would upload the (possibly partial) object.
        try {
            ((Abortable) out).abort();
        } catch (Exception ignored) {
            // not abortable / best effort: an unclosed S3A stream uploads nothing
        }
    }
}
