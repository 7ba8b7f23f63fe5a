DROP TABLE deliveries;
DROP TABLE events;
