/*
 * A Delta LogStore for S3-compatible stores that several writers (JVMs, machines) share safely,
 * without DynamoDB: a commit file is written with S3's put-if-absent (`If-None-Match: *`), so of two
 * writers racing for one table version the store accepts one and refuses the other (412), and the
 * refused one gets the FileAlreadyExistsException Delta expects: it checks the winner's commit for
 * conflicts and retries at the next version, as on HDFS.
 *
 * Why our own: Delta 4.4.0 ships S3SingleDriverLogStore (mutual exclusion inside one JVM only) and
 * S3DynamoDBLogStore (needs DynamoDB); its conditional-write S3 LogStore was proposed but is not in
 * a release. Hadoop 3.5.0's S3A does the conditional PUT when a file is created with the builder
 * option `fs.option.create.conditional.overwrite` (HADOOP-19256); FileSystem.create(path, false),
 * which Delta's LogStores call, checks with a HEAD and then PUTs unconditionally, a race.
 *
 * Compiled by `python -m infra.jars fetch` against PySpark's Hadoop, hadoop-aws and delta-storage
 * (infra/jars.py); used only for an s3a:// lake (infra/lake_store.py).
 */
package social.delta;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

import io.delta.storage.HadoopFileSystemLogStore;

public class S3ConditionalPutLogStore extends HadoopFileSystemLogStore {
    /** S3A's builder option for put-if-absent (Hadoop 3.4.2+). */
    public static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

    public S3ConditionalPutLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        final FileSystem fs = path.getFileSystem(hadoopConf);
        if (overwrite) {
            try (FSDataOutputStream out = fs.create(path, true)) {
                writeAll(out, actions);
            }
            return;
        }
        FSDataOutputStream out =
            (FSDataOutputStream) fs.createFile(path).overwrite(false).must(CONDITIONAL_CREATE, true).build();
        try {
            writeAll(out, actions);
            out.close(); // the PUT, with If-None-Match: *
        } catch (IOException e) {
            if (refusedAsExisting(e)) {
                throw new java.nio.file.FileAlreadyExistsException(path.toString());
            }
            throw e;
        }
    }

    private static void writeAll(FSDataOutputStream out, Iterator<String> actions) throws IOException {
        while (actions.hasNext()) {
            out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
    }

    /** S3A answers a refused conditional PUT (412 Precondition Failed) with RemoteFileChangedException. */
    private static boolean refusedAsExisting(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof RemoteFileChangedException
                    || t instanceof org.apache.hadoop.fs.FileAlreadyExistsException
                    || t instanceof java.nio.file.FileAlreadyExistsException) {
                return true;
            }
        }
        return false;
    }

    /** A PUT is atomic: an object is visible whole or not at all. */
    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }
}
